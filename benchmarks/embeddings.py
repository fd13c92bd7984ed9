"""Sentence embeddings per second on this machine: keras_tfm's `embed` (each Keras backend) vs
sentence-transformers' `encode` (PyTorch), the same checkpoint and texts.

    python benchmarks/embeddings.py

The checkpoint has all-MiniLM-L6-v2's shape (BERT, 6 layers, 12 heads, 384 wide, FFN 1536, vocabulary 30,522,
mean pooling, unit length, texts cut at 256 tokens), random weights, written once by keras_tfm as a
sentence-transformers directory that both read. Texts: 1,024 lines of WikiText-2 (../shared/data), 4 to
256+ tokens, batches of 32 (both sort by length). keras-hub has no sentence-transformers model. Each row
also gives its process's resident peak (interpreter, libraries and all) beside the weights' size.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Timer, main  # noqa: E402

CHECKPOINT = os.path.join(tempfile.gettempdir(), "keras_tfm_bench_minilm")
TEXTS, BATCH, WINDOWS = 1024, 32, 3


def texts() -> list[str]:
    path = os.path.join(REPO, "..", "shared", "data", "wikitext-2", "valid.txt")
    with open(path, encoding="utf-8") as file:
        lines = [line.strip() for line in file if len(line.split()) >= 4 and not line.startswith(" =")]
    return lines[:TEXTS]


def write_checkpoint() -> None:
    """The all-MiniLM-L6-v2-shaped checkpoint, with a WordPiece vocabulary learned on the texts."""
    import keras

    import keras_tfm
    from keras_tfm.data import WordPieceTokenizer

    keras.utils.set_random_seed(0)
    tokenizer = WordPieceTokenizer.fit("\n".join(texts()), vocabulary_size=8192)
    encoder = keras_tfm.Bert(vocabulary_size=30522, max_length=512, num_layers=6, num_heads=12, hidden_dim=384,
                             intermediate_dim=1536)  # fmt: skip
    embedder = keras_tfm.SentenceEmbedder(encoder, pooling="mean", max_sequence_length=256)
    embedder.tokenizer = tokenizer
    keras_tfm.save_huggingface(embedder, CHECKPOINT, overwrite=True)


def worker(contender: str, task: str = "embed") -> dict:
    corpus = texts()
    if contender == "keras_tfm":
        import keras_tfm

        embedder = keras_tfm.from_huggingface(CHECKPOINT)
        embed = lambda: embedder.embed(corpus, batch_size=BATCH)  # noqa: E731
    elif contender == "sentence_transformers":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_grad_enabled(False)
        model = SentenceTransformer(CHECKPOINT, device="cpu")
        embed = lambda: model.encode(corpus, batch_size=BATCH, show_progress_bar=False)  # noqa: E731
    else:
        raise ValueError(contender)
    embed()  # compiles every shape the texts need (JAX, TensorFlow)
    rates = []
    for _ in range(WINDOWS):
        with Timer() as timer:
            embed()
        rates.append(len(corpus) / timer.seconds)
    weights = sum(
        os.path.getsize(os.path.join(CHECKPOINT, name))
        for name in os.listdir(CHECKPOINT)
        if name.endswith(".safetensors")
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's resident peak, whole run
    return {"value": max(rates), "windows": [round(rate, 1) for rate in rates], "peak_MB": round(peak),
            "weights_MB": round(weights / 2**20)}  # fmt: skip


CONTENDERS = [(f"keras_tfm ({backend})", "keras_tfm", backend) for backend in ("jax", "tensorflow", "torch")]
CONTENDERS.append(("sentence_transformers (torch)", "sentence_transformers", "torch"))

if __name__ == "__main__":
    if "--worker" not in sys.argv:
        write_checkpoint()
    main(
        __doc__,
        __file__,
        worker,
        {"embed": ("Sentence embeddings, all-MiniLM-L6-v2 shape, 1,024 WikiText-2 lines, batch 32", "texts/s")},
        contenders=CONTENDERS,
        baselines={"sentence-transformers": "sentence_transformers (torch)"},
        same_backend={"embed": "sentence_transformers"},
    )
