"""BERT masked-LM quality: keras_tfm vs keras-hub trained the same way, then fine-tuning on movie reviews.

Both models get the same WordPiece vocabulary (keras-hub's compute_word_piece_vocabulary, trained on the
training text), the same sequences, the same dynamic masks (15%, 80/10/10, seeded per step), the same
configuration, optimizer (AdamW, warmup + cosine), batch and number of steps, on the same Keras backend.
Training text: WikiText-2 valid + the movie reviews (../shared/data); evaluation: masked-token accuracy
on WikiText-2 test with one fixed set of masks. Then our pretrained encoder is fine-tuned to classify the
movie reviews (positive/negative, 10% held out).

    python benchmarks/bert_quality.py [--backend jax] [--steps 1500] [--seed 0]

`--seed` changes both models' initial weights, the batch order and the training masks (the two
models still share them); the test masks stay the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, Timer, report, run_worker, write_results  # noqa: E402

DATA = os.path.join(REPO, "..", "shared", "data")
TRAIN_TEXT = f"{DATA}/wikitext-2/valid.txt,{DATA}/movie_reviews/movie_reviews.zip"
TEST_TEXT = f"{DATA}/wikitext-2/test.txt"
REVIEWS = f"{DATA}/movie_reviews/movie_reviews.zip"
CONFIG = dict(num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=512)
LENGTH, MASKED = 128, 20


def worker(contender: str, options: dict) -> dict:
    import keras
    import numpy as np

    from keras_tfm.data import load_tokenizer, read_text
    from keras_tfm.data.masking import DynamicMasker, pack_sequences
    from keras_tfm.data.tokenizers import WORDPIECE_RESERVED
    from keras_tfm.training import make_optimizer

    seed = options["seed"]
    keras.utils.set_random_seed(seed)
    tokenizer = load_tokenizer(options["tokenizer"])
    pad, cls, sep, mask = (WORDPIECE_RESERVED.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    train = pack_sequences(tokenizer.encode(read_text(TRAIN_TEXT)), LENGTH, cls, sep)
    test = pack_sequences(tokenizer.encode(read_text(TEST_TEXT)), LENGTH, cls, sep, "test")
    masker = DynamicMasker(tokenizer.vocabulary_size, mask, [pad, cls, sep], pad, 0.15, MASKED)
    batch, steps = options["batch_size"], options["steps"]

    def batches():
        """Every step's masked batch, concatenated in order (fit then reads them with shuffle=False)."""
        parts = [
            masker(train[np.random.default_rng([seed, step]).choice(len(train), batch, replace=False)], [seed, step])
            for step in range(steps)
        ]
        return (
            {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]},
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )

    if contender == "keras_tfm":
        import keras_tfm

        model = keras_tfm.BertMLM(vocabulary_size=tokenizer.vocabulary_size, max_length=LENGTH, **CONFIG)
        adapt = dict
    else:
        import keras_hub

        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=tokenizer.vocabulary_size,
            max_sequence_length=LENGTH,
            num_layers=CONFIG["num_layers"],
            num_heads=CONFIG["num_heads"],
            hidden_dim=CONFIG["hidden_dim"],
            intermediate_dim=CONFIG["intermediate_dim"],
        )
        model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)

        def adapt(inputs):
            return {**inputs, "segment_ids": np.zeros_like(inputs["token_ids"])}

    schedule = argparse.Namespace(
        learning_rate=options["learning_rate"], warmup_steps=steps // 20, weight_decay=0.01, clip_norm=1.0, ema=None
    )
    model.compile(
        optimizer=make_optimizer(schedule, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="masked_accuracy")],
        jit_compile=keras.backend.backend() != "torch",
    )
    x, y, w = batches()  # arrays, not a generator: keras-hub's Task.fit does not take generators
    with Timer() as timer:
        model.fit(adapt(x), y, sample_weight=w, batch_size=batch, epochs=1, shuffle=False, verbose=2)
    x, y, w = masker(test, [1, 0])
    result = model.evaluate(adapt(x), y, sample_weight=w, batch_size=batch, return_dict=True, verbose=0)
    record = {
        "value": result["masked_accuracy"],
        "test_loss": result["loss"],
        "parameters": model.count_params(),
        "train_seconds": round(timer.seconds, 1),
        "masked_test_tokens": int(w.sum()),
        "vocabulary_size": tokenizer.vocabulary_size,
        "train_sequences": len(train),
    }
    if contender == "keras_tfm":
        record.update(finetune(model, tokenizer, (pad, cls, sep), batch))
    return record


def finetune(pretrained, tokenizer, special, batch: int) -> dict:
    import keras
    import keras_hub
    import numpy as np

    import keras_tfm
    from keras_tfm.data import load_labelled_text

    pad, cls, sep = special
    texts, labels, _ = load_labelled_text(REVIEWS)
    packer = keras_hub.layers.StartEndPacker(LENGTH, start_value=cls, end_value=sep, pad_value=pad)
    ids = np.asarray(packer(tokenizer.encode_lines([" ".join(t.split()) for t in texts])), "int32")
    order = np.random.default_rng(0).permutation(len(texts))
    train, test = order[: int(0.9 * len(texts))], order[int(0.9 * len(texts)) :]
    classifier = keras_tfm.BertClassifier(
        num_classes=2, vocabulary_size=tokenizer.vocabulary_size, max_length=LENGTH, **CONFIG
    )
    classifier.build()
    classifier.encoder.set_weights(pretrained.encoder.get_weights())
    classifier.compile(
        optimizer=keras.optimizers.AdamW(1e-4),
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.backend.backend() != "torch",
    )

    def inputs(rows):
        return {"token_ids": ids[rows], "padding_mask": ids[rows] != pad}

    with Timer() as timer:
        classifier.fit(inputs(train), labels[train], batch_size=batch, epochs=4, verbose=2)
    accuracy = classifier.evaluate(inputs(test), labels[test], batch_size=batch, return_dict=True, verbose=0)[
        "accuracy"
    ]
    return {
        "finetune_accuracy": accuracy,
        "finetune_epochs": 4,
        "finetune_seconds": round(timer.seconds, 1),
        "finetune_test_reviews": len(test),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("CONTENDER", "OPTIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="jax", choices=["jax", "tensorflow", "torch"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--vocabulary-size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.worker:
        report(worker(args.worker[0], json.loads(args.worker[1])))
        return
    from keras_tfm.data import WordPieceTokenizer, read_text

    directory = tempfile.mkdtemp()
    tokenizer = WordPieceTokenizer.fit(read_text(TRAIN_TEXT), args.vocabulary_size)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    options = json.dumps(
        {
            "tokenizer": os.path.join(directory, "tokenizer.json"),
            "steps": args.steps,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "seed": args.seed,
        }
    )
    results = {
        name: run_worker(__file__, args.backend, [name, options], timeout=3600) for name in ("keras_tfm", "keras_hub")
    }
    print(
        f"\n### BERT masked LM, {CONFIG['num_layers']} layers / {CONFIG['num_heads']} heads / {CONFIG['hidden_dim']} wide, "
        f"FFN {CONFIG['intermediate_dim']}, sequence {LENGTH}, {args.steps} steps of batch {args.batch_size}, "
        f"{args.backend} backend, seed {args.seed}\n"
    )
    print("| model | parameters | WikiText-2 test masked-token accuracy | test loss | train time |")
    print("|---|---:|---:|---:|---:|")
    for name, result in results.items():
        if "error" in result:
            print(f"| {name} | failed: {result['error'][0][:100]} | | | |")
            continue
        print(
            f"| {name} | {result['parameters']:,} | {result['value']:.4f} | {result['test_loss']:.3f} | "
            f"{result['train_seconds']:.0f} s |"
        )
    ours = results["keras_tfm"]
    if "finetune_accuracy" in ours:
        print(
            f"\nFine-tuning keras_tfm's encoder on movie reviews ({ours['finetune_epochs']} epochs, "
            f"{ours['finetune_seconds']:.0f} s): accuracy {ours['finetune_accuracy']:.4f} on "
            f"{ours['finetune_test_reviews']} held-out reviews"
        )
    print(json.dumps(results))
    rows = [
        {"contender": name, "task": "quality", "unit": "masked-token accuracy", **result}
        for name, result in results.items()
        if "error" not in result
    ]
    title = f"BERT masked LM against keras-hub, {args.backend} backend, seed {args.seed}"
    write_results(f"bert_quality_seed{args.seed}", rows, {"quality": title})


if __name__ == "__main__":
    main()
