"""GPT speed on this machine: training tokens/s and greedy generation tokens/s, keras_tfm vs
keras-hub (each Keras backend) vs Hugging Face transformers (PyTorch), same configuration.

    python benchmarks/gpt.py                  # both tables
    python benchmarks/gpt.py --only train     # or: --only generate

Training: nanoGPT's CPU Shakespeare configuration (4 layers, 4 heads, 128 wide, context 64,
batch 12, vocabulary 65, no dropout), AdamW, random tokens. Generation: the same model with context
256, batch 1, a 16-token prompt, 200 new tokens, greedy.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Timer, keras_train_throughput, main, torch_train_throughput  # noqa: E402

CONFIG = dict(vocabulary_size=65, num_layers=4, num_heads=4, hidden_dim=128)
TRAIN = dict(context=64, batch=12, warmup_steps=10, steps=30, windows=5)  # steps: per timed window
GENERATE = dict(context=256, prompt=16, new_tokens=200, repeats=10)


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


def random_tokens(n, length):
    import numpy as np

    return np.random.default_rng(0).integers(0, CONFIG["vocabulary_size"], size=(n, length + 1)).astype("int32")


def worker(contender: str, task: str) -> dict:
    import numpy as np

    n = TRAIN["batch"] * (TRAIN["warmup_steps"] + TRAIN["steps"])
    if contender == "keras_tfm":
        import keras_tfm

        if task == "train":
            data = random_tokens(n, TRAIN["context"])
            model = keras_tfm.GPT(max_length=TRAIN["context"], **CONFIG)
            return keras_train(model, data[:, :-1], data[:, 1:], keras_tfm.TokenCrossEntropy())
        model = keras_tfm.GPT(max_length=GENERATE["context"], **CONFIG)
        prompt = random_tokens(1, GENERATE["prompt"] - 1)
        model.generate(prompt, max_new_tokens=GENERATE["new_tokens"])  # compile
        with Timer() as timer:
            for _ in range(GENERATE["repeats"]):
                out = model.generate(prompt, max_new_tokens=GENERATE["new_tokens"])
        assert out.shape[1] == GENERATE["prompt"] + GENERATE["new_tokens"]
        return {"value": GENERATE["repeats"] * GENERATE["new_tokens"] / timer.seconds}

    if contender == "keras_hub":
        import keras_hub

        context = TRAIN["context"] if task == "train" else GENERATE["context"]
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=CONFIG["vocabulary_size"],
            num_layers=CONFIG["num_layers"],
            num_heads=CONFIG["num_heads"],
            hidden_dim=CONFIG["hidden_dim"],
            intermediate_dim=4 * CONFIG["hidden_dim"],
            dropout=0.0,
            max_sequence_length=context,
        )
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        if task == "train":
            data = random_tokens(n, context)
            inputs = {"token_ids": data[:, :-1], "padding_mask": np.ones_like(data[:, :-1], bool)}
            return keras_train(model, inputs, data[:, 1:])
        total = GENERATE["prompt"] + GENERATE["new_tokens"]
        ids = np.zeros((1, total), "int32")
        ids[:, : GENERATE["prompt"]] = random_tokens(1, GENERATE["prompt"] - 1)
        mask = np.zeros((1, total), bool)
        mask[:, : GENERATE["prompt"]] = True
        inputs = {"token_ids": ids, "padding_mask": mask}
        model.generate(inputs, stop_token_ids=None)
        with Timer() as timer:
            for _ in range(GENERATE["repeats"]):
                model.generate(inputs, stop_token_ids=None)
        return {"value": GENERATE["repeats"] * GENERATE["new_tokens"] / timer.seconds}

    if contender == "hugging_face":
        import torch
        import transformers

        context = TRAIN["context"] if task == "train" else GENERATE["context"]
        config = transformers.GPT2Config(
            vocab_size=CONFIG["vocabulary_size"],
            n_layer=CONFIG["num_layers"],
            n_head=CONFIG["num_heads"],
            n_embd=CONFIG["hidden_dim"],
            n_positions=context,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(config)
        if task == "train":
            data = torch.tensor(random_tokens(n, context), dtype=torch.long)
            b = TRAIN["batch"]
            batches = [(data[i * b : (i + 1) * b, :-1], data[i * b : (i + 1) * b, 1:]) for i in range(len(data) // b)]

            def loss_fn(model, inputs, targets):
                logits = model(inputs).logits
                return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

            return torch_train_throughput(
                model, loss_fn, batches, TRAIN["warmup_steps"], TRAIN["steps"], TRAIN["windows"], TRAIN["context"]
            )
        model.eval()
        prompt = torch.tensor(random_tokens(1, GENERATE["prompt"] - 1), dtype=torch.long)
        kwargs = dict(
            max_new_tokens=GENERATE["new_tokens"],
            min_new_tokens=GENERATE["new_tokens"],
            do_sample=False,
            pad_token_id=0,
            attention_mask=torch.ones_like(prompt),
        )
        with torch.no_grad():
            model.generate(prompt, **kwargs)
            with Timer() as timer:
                for _ in range(GENERATE["repeats"]):
                    model.generate(prompt, **kwargs)
        return {"value": GENERATE["repeats"] * GENERATE["new_tokens"] / timer.seconds}
    raise ValueError(contender)


if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "train": ("Training, 4 layers / 4 heads / 128 wide, context 64, batch 12", "train tokens/s"),
            "generate": ("Greedy generation, batch 1, 200 new tokens, context 256", "new tokens/s"),
        },
    )
