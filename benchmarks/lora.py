"""LoRA fine-tuning speed on this machine: training tokens/s of a GPT-2-shaped model with every weight
trained ("full") and with rank-8 LoRA on the attention's query and value projections ("lora"):
keras_tfm and keras-hub (`GPT2Backbone.enable_lora`) on each Keras backend, Hugging Face
`GPT2LMHeadModel` and the same with `peft` (PyTorch).

    python benchmarks/lora.py [--rounds 2]

The model: GPT-2 small's width and vocabulary (768 wide, 12 heads, 50,257 tokens) with 4 layers,
context 128, batch 2, no dropout, AdamW, random tokens. keras-hub's LoRA also trains the biases of the
query and value projections; keras_tfm and peft do not (peft's `bias="none"`). peft's LoRA is of
GPT-2's fused query/key/value projection, with as many trained weights as ours.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, keras_train_throughput, main, torch_train_throughput  # noqa: E402

CONFIG = dict(vocabulary_size=50257, num_layers=4, num_heads=12, hidden_dim=768)
TRAIN = dict(context=128, batch=2, warmup_steps=2, steps=3, windows=3)  # steps: per timed window
RANK = 8


def random_tokens():
    import numpy as np

    n = TRAIN["batch"] * (TRAIN["warmup_steps"] + TRAIN["steps"])
    return (
        np.random.default_rng(0).integers(0, CONFIG["vocabulary_size"], size=(n, TRAIN["context"] + 1)).astype("int32")
    )


def keras_train(model, inputs, targets, loss=None) -> dict:
    return keras_train_throughput(
        model,
        inputs,
        targets,
        TRAIN["batch"],
        TRAIN["warmup_steps"],
        TRAIN["steps"],
        TRAIN["windows"],
        TRAIN["context"],
        loss,
    )


def worker(contender: str, task: str) -> dict:
    import numpy as np

    library, mode = contender.split(":")
    data = random_tokens()
    if library == "keras_tfm":
        import keras_tfm

        model = keras_tfm.GPT(max_length=TRAIN["context"], dropout=0.0, **CONFIG)
        if mode == "lora":
            model.enable_lora(RANK)
        return keras_train(model, data[:, :-1], data[:, 1:], keras_tfm.TokenCrossEntropy())

    if library == "keras_hub":
        import keras_hub

        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=CONFIG["vocabulary_size"],
            num_layers=CONFIG["num_layers"],
            num_heads=CONFIG["num_heads"],
            hidden_dim=CONFIG["hidden_dim"],
            intermediate_dim=4 * CONFIG["hidden_dim"],
            dropout=0.0,
            max_sequence_length=TRAIN["context"],
        )
        if mode == "lora":
            backbone.enable_lora(RANK)
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        inputs = {"token_ids": data[:, :-1], "padding_mask": np.ones_like(data[:, :-1], bool)}
        return keras_train(model, inputs, data[:, 1:])

    if library == "hugging_face":
        import torch
        import transformers

        config = transformers.GPT2Config(
            vocab_size=CONFIG["vocabulary_size"],
            n_layer=CONFIG["num_layers"],
            n_head=CONFIG["num_heads"],
            n_embd=CONFIG["hidden_dim"],
            n_positions=TRAIN["context"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = transformers.GPT2LMHeadModel(config)
        if mode == "lora":
            import peft

            # GPT-2 keeps query, key and value in one projection (c_attn), peft's usual target for it: rank 8
            # there trains as many weights as ours on query and value, 8 x (768 + 2,304) = 2 x 8 x (768 + 768).
            model = peft.get_peft_model(
                model, peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=["c_attn"], fan_in_fan_out=True)
            )
        tokens = torch.tensor(data, dtype=torch.long)
        b = TRAIN["batch"]
        batches = [(tokens[i * b : (i + 1) * b, :-1], tokens[i * b : (i + 1) * b, 1:]) for i in range(len(tokens) // b)]

        def loss_fn(model, inputs, targets):
            logits = model(input_ids=inputs).logits
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

        return torch_train_throughput(
            model, loss_fn, batches, TRAIN["warmup_steps"], TRAIN["steps"], TRAIN["windows"], TRAIN["context"]
        )
    raise ValueError(contender)


CONTENDERS = [
    (f"{library} {mode} ({backend})", f"{library}:{mode}", backend)
    for library in ("keras_tfm", "keras_hub")
    for backend in BACKENDS
    for mode in ("full", "lora")
]
CONTENDERS += [(f"hugging_face {mode} (torch)", f"hugging_face:{mode}", "torch") for mode in ("full", "lora")]

if __name__ == "__main__":
    main(
        __doc__,
        os.path.abspath(__file__),
        worker,
        {
            "train": (
                f"LoRA fine-tuning, GPT-2 width, 4 layers, context {TRAIN['context']}, batch {TRAIN['batch']}, "
                f"rank {RANK}",
                "train tokens/s",
            )
        },
        contenders=CONTENDERS,
        baselines={
            "Hugging Face full": "hugging_face full (torch)",
            "Hugging Face + peft": "hugging_face lora (torch)",
            "keras-hub lora (jax)": "keras_hub lora (jax)",
            "keras-hub lora (torch)": "keras_hub lora (torch)",
        },
    )
