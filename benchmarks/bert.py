"""BERT masked-LM training speed on this machine: tokens/s, keras_tfm vs keras-hub (each Keras backend) vs
Hugging Face transformers (PyTorch), same configuration.

    python benchmarks/bert.py

Configuration: 4 layers, 4 heads, 256 wide, FFN 1024, sequence 128, batch 16, vocabulary 8192,
20 masked positions per sequence, AdamW, random tokens. keras_tfm and keras-hub compute logits only at the
masked positions; Hugging Face's BertForMaskedLM computes them everywhere (its design) and ignores the rest
in the loss.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import keras_train_throughput, main, torch_train_throughput  # noqa: E402

LAYERS, HEADS, WIDTH, FFN, LENGTH, BATCH, VOCABULARY, MASKED = 4, 4, 256, 1024, 128, 16, 8192, 20
WARMUP_STEPS, STEPS, WINDOWS = 5, 20, 4  # STEPS: per timed window


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    n = BATCH * (WARMUP_STEPS + STEPS)  # batches are reused across windows
    token_ids = rng.integers(5, VOCABULARY, size=(n, LENGTH)).astype("int32")
    positions = np.sort(np.stack([rng.choice(np.arange(1, LENGTH - 1), MASKED, replace=False) for _ in range(n)]), 1)
    labels = np.take_along_axis(token_ids, positions, 1)
    masked_ids = token_ids.copy()
    np.put_along_axis(masked_ids, positions, 4, 1)
    return masked_ids, positions.astype("int32"), labels


def worker(contender: str, task: str = "train") -> dict:
    import numpy as np

    token_ids, positions, labels = data()
    padding_mask = np.ones_like(token_ids, dtype=bool)
    if contender == "keras_tfm":
        import keras_tfm

        model = keras_tfm.BertMLM(
            vocabulary_size=VOCABULARY,
            max_length=LENGTH,
            num_layers=LAYERS,
            num_heads=HEADS,
            hidden_dim=WIDTH,
            intermediate_dim=FFN,
        )
        inputs = {"token_ids": token_ids, "padding_mask": padding_mask, "mask_positions": positions}
        return keras_train_throughput(
            model, inputs, labels, BATCH, WARMUP_STEPS, STEPS, WINDOWS, LENGTH, loss=keras_tfm.TokenCrossEntropy()
        )
    if contender == "keras_hub":
        import keras_hub

        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=VOCABULARY,
            num_layers=LAYERS,
            num_heads=HEADS,
            hidden_dim=WIDTH,
            intermediate_dim=FFN,
            max_sequence_length=LENGTH,
        )
        model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
        inputs = {
            "token_ids": token_ids,
            "segment_ids": np.zeros_like(token_ids),
            "padding_mask": padding_mask,
            "mask_positions": positions,
        }
        return keras_train_throughput(model, inputs, labels, BATCH, WARMUP_STEPS, STEPS, WINDOWS, LENGTH)
    if contender == "hugging_face":
        import torch
        import transformers

        config = transformers.BertConfig(
            vocab_size=VOCABULARY,
            hidden_size=WIDTH,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            max_position_embeddings=LENGTH,
        )
        model = transformers.BertForMaskedLM(config)
        full_labels = np.full_like(token_ids, -100)
        np.put_along_axis(full_labels, positions, labels, 1)
        ids, y = torch.tensor(token_ids, dtype=torch.long), torch.tensor(full_labels, dtype=torch.long)
        batches = [(ids[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(len(ids) // BATCH)]

        def loss_fn(model, inputs, targets):
            return model(input_ids=inputs, attention_mask=torch.ones_like(inputs), labels=targets).loss

        return torch_train_throughput(model, loss_fn, batches, WARMUP_STEPS, STEPS, WINDOWS, LENGTH)
    raise ValueError(contender)


if __name__ == "__main__":
    main(
        __doc__,
        __file__,
        worker,
        {
            "train": (
                f"BERT masked-LM training, {LAYERS} layers / {HEADS} heads / {WIDTH} wide, FFN {FFN}, sequence {LENGTH}, "
                f"batch {BATCH}, vocabulary {VOCABULARY}, {MASKED} masked positions",
                "train tokens/s",
            )
        },
    )
