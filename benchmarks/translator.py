"""Translator speed on this machine: keras_tfm (each Keras backend) vs Hugging Face MarianMTModel (PyTorch),
same configuration: training tokens/s and beam-search (beam 4) sentences/s.

    python benchmarks/translator.py [--only train|translate]

Configuration (the Multi30k-sized model): 3 + 3 layers, 8 heads, 256 wide, FFN 512, one shared
vocabulary of 8000, source and target 24 tokens, training batch 64 (AdamW); translation: 32 sentences of
24 tokens, beam 4, exactly 24 new tokens each (no end token: Hugging Face gets min_new_tokens).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, Timer, keras_train_throughput, main, torch_train_throughput  # noqa: E402

VOCABULARY, LENGTH, BATCH, WARMUP_STEPS, STEPS, WINDOWS = 8000, 24, 64, 3, 10, 4  # STEPS: per window
SENTENCES, BEAMS, REPEATS = 32, 4, 3
CONFIG = dict(num_encoder_layers=3, num_decoder_layers=3, num_heads=8, hidden_dim=256, intermediate_dim=512)


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    n = BATCH * (WARMUP_STEPS + STEPS)
    source = rng.integers(3, VOCABULARY, size=(n, LENGTH)).astype("int32")
    target = rng.integers(3, VOCABULARY, size=(n, LENGTH + 1)).astype("int32")
    return source, target[:, :-1], target[:, 1:]


def keras_tfm_model():
    import keras_tfm

    return keras_tfm.Translator(
        source_vocabulary_size=VOCABULARY, share_embeddings=True, dropout=0.0, max_length=64, end_token_id=-1, **CONFIG
    )


def hugging_face_model():
    import transformers

    config = transformers.MarianConfig(
        vocab_size=VOCABULARY,
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=512,
        decoder_ffn_dim=512,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
        forced_eos_token_id=None,
        dropout=0.0,
    )
    return transformers.MarianMTModel(config)


def worker(contender: str, task: str) -> dict:
    source, target_in, target_out = data()
    if contender == "keras_tfm":
        import keras_tfm

        model = keras_tfm_model()
        if task == "train":
            inputs = {"source_ids": source, "target_ids": target_in}
            return keras_train_throughput(
                model,
                inputs,
                target_out,
                BATCH,
                WARMUP_STEPS,
                STEPS,
                WINDOWS,
                LENGTH,
                loss=keras_tfm.TokenCrossEntropy(),
            )
        model.translate(source[:SENTENCES], max_length=LENGTH, beam_size=BEAMS)
        with Timer() as timer:
            for _ in range(REPEATS):
                model.translate(source[:SENTENCES], max_length=LENGTH, beam_size=BEAMS)
        return {"value": REPEATS * SENTENCES / timer.seconds}
    import torch

    model = hugging_face_model()
    src, tin, tout = (torch.tensor(a, dtype=torch.long) for a in (source, target_in, target_out))
    if task == "train":
        batches = [
            ((src[i * BATCH : (i + 1) * BATCH], tin[i * BATCH : (i + 1) * BATCH]), tout[i * BATCH : (i + 1) * BATCH])
            for i in range(len(src) // BATCH)
        ]

        def loss_fn(model, inputs, targets):
            logits = model(input_ids=inputs[0], decoder_input_ids=inputs[1]).logits
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

        return torch_train_throughput(model, loss_fn, batches, WARMUP_STEPS, STEPS, WINDOWS, LENGTH)
    model.eval()
    kwargs = dict(
        num_beams=BEAMS,
        max_new_tokens=LENGTH,
        min_new_tokens=LENGTH,
        do_sample=False,
        attention_mask=torch.ones_like(src[:SENTENCES]),
    )
    with torch.no_grad():
        model.generate(src[:SENTENCES], **kwargs)
        with Timer() as timer:
            for _ in range(REPEATS):
                model.generate(src[:SENTENCES], **kwargs)
    return {"value": REPEATS * SENTENCES / timer.seconds}


if __name__ == "__main__":
    contenders = [(f"keras_tfm ({backend})", "keras_tfm", backend) for backend in BACKENDS]
    contenders.append(("hugging_face marian (torch)", "hugging_face", "torch"))
    main(
        __doc__,
        __file__,
        worker,
        {
            "train": (
                "Translator training, 3 + 3 layers / 8 heads / 256 wide, FFN 512, 24 + 24 tokens, batch 64",
                "train target tokens/s",
            ),
            "translate": ("Beam search (4 beams), 32 sentences of 24 tokens, 24 new tokens each", "sentences/s"),
        },
        contenders,
        {"Hugging Face": "hugging_face marian (torch)"},
    )
