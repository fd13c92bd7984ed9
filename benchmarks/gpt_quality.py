"""Language-model quality against nanoGPT's published CPU run on tiny Shakespeare (characters).

nanoGPT (4 layers, 4 heads, 128 wide, context 64, batch 12, 2000 iterations, no dropout, AdamW
lr 1e-3 with warmup and cosine decay, first 90% of the text for training) reports validation loss
1.88. This trains `keras_tfm.gpt_shakespeare_char_cpu()` (GPT-2's form) and
`keras_tfm.llama_shakespeare_char_cpu()` (the Llama form: RoPE, RMSNorm, SwiGLU; the same 0.80M
parameters) in turn on the same number of tokens (2000 x 12 x 64, the same random windows, as nanoGPT
samples them) and evaluates each on the last 10%; then evaluates each trained model again quantized to
int8 and to int4 weights (`model.quantize`): its loss, and how far it answers from the float model
(`quantization_error`). Writes benchmarks/results/gpt_quality.json.

    python benchmarks/gpt_quality.py [--data ../shared/data/tinyshakespeare/input.txt] [--learning-rate 3e-3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_results  # noqa: E402

MODELS = ("gpt_shakespeare_char_cpu", "llama_shakespeare_char_cpu")

DEFAULT_DATA = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "tinyshakespeare", "input.txt"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA, help="tiny Shakespeare input.txt")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--curve-every", type=int, default=100, help="steps between the learning curve's points")
    args = parser.parse_args()
    if not os.path.isfile(args.data):
        raise SystemExit(f"--data: no file at {args.data!r}; pass the path of tiny Shakespeare's input.txt.")
    results = [train_and_evaluate(name, args) for name in args.models]
    write_results("gpt_quality", results)


def learning_curve(train: tuple, validation: tuple, batch_size: int, every: int):
    """A callback that records, every `every` steps, the loss on fixed training and validation batches
    (timed apart from training, in `seconds`), in `points`."""
    import keras

    class LearningCurve(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.points = {"step": [], "train_loss": [], "validation_loss": []}
            self.steps, self.seconds = 0, 0.0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps % every:
                return
            start = time.perf_counter()
            self.points["step"].append(self.steps)
            for name, (x, y) in (("train_loss", train), ("validation_loss", validation)):
                loss = self.model.evaluate(x, y, batch_size=batch_size, verbose=0)
                self.points[name].append(round(float(loss), 4))
            self.seconds += time.perf_counter() - start

    return LearningCurve()


def quantization_error(model, quantized, windows: np.ndarray, mode: str) -> dict:
    """How far `quantized` answers from the float `model` on validation `windows`: the share of positions
    whose most likely next character is the same, the mean absolute logit difference, and
    the share of greedy continuations' characters that are the same (16 prompts of 16 characters, 32 new
    each: after a first difference the two go their own ways)."""
    logits = model.predict(windows, batch_size=len(windows), verbose=0)
    quantized_logits = quantized.predict(windows, batch_size=len(windows), verbose=0)
    difference = np.abs(logits - quantized_logits)
    prompts = windows[:16, :16]
    greedy = model.generate(prompts, max_new_tokens=32)[:, 16:]
    quantized_greedy = quantized.generate(prompts, max_new_tokens=32)[:, 16:]
    return {
        f"top1_agreement_{mode}": round(float((logits.argmax(-1) == quantized_logits.argmax(-1)).mean()), 4),
        f"logit_mean_difference_{mode}": round(float(difference.mean()), 4),
        f"greedy_agreement_{mode}": round(float((greedy == quantized_greedy).mean()), 4),
    }


def train_and_evaluate(name: str, args) -> dict:
    import keras

    import keras_tfm

    keras.utils.set_random_seed(args.seed)
    text = open(args.data, encoding="utf-8").read()
    vocabulary = sorted(set(text))
    index = {c: i for i, c in enumerate(vocabulary)}
    ids = np.array([index[c] for c in text], "int32")
    split = int(0.9 * len(ids))
    train, validation = ids[:split], ids[split:]
    model = getattr(keras_tfm, name)(vocabulary_size=len(vocabulary))
    context = model.max_length
    rng = np.random.default_rng(args.seed)

    def windows(data, count):
        starts = rng.integers(0, len(data) - context - 1, size=count)
        batch = np.stack([data[s : s + context + 1] for s in starts])
        return batch[:, :-1], batch[:, 1:]

    x, y = windows(train, args.iterations * args.batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=args.iterations - args.warmup,
        alpha=0.1,
        warmup_target=args.learning_rate,
        warmup_steps=args.warmup,
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, beta_2=0.99, weight_decay=0.1, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.backend.backend() != "torch",
    )
    vx, vy = windows(validation, args.eval_batches * args.batch_size)
    rows = 20 * args.batch_size  # the curve's batches: the first of the training and validation windows
    curve = learning_curve((x[:rows], y[:rows]), (vx[:rows], vy[:rows]), args.batch_size, args.curve_every)
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=2, callbacks=[curve])
    seconds = time.perf_counter() - start - curve.seconds
    validation_loss = model.evaluate(vx, vy, batch_size=args.batch_size, verbose=0)
    saved = os.path.join(tempfile.mkdtemp(), "trained.keras")
    model.save(saved)
    quantized_losses = {}
    for mode in ("int8", "int4"):
        quantized = keras.saving.load_model(saved)  # the trained model, compiled
        quantized.quantize(mode)
        loss = quantized.evaluate(vx, vy, batch_size=args.batch_size, verbose=0)
        quantized_losses[f"validation_loss_{mode}"] = round(float(loss), 4)
        quantized_losses.update(quantization_error(model, quantized, vx[:rows], mode))
    sample = model.generate(
        [[vocabulary.index("\n")]], max_new_tokens=model.max_length - 1, temperature=0.8, top_k=20, seed=0
    )[0]
    result = {
        "model": name,
        "backend": keras.backend.backend(),
        "parameters": model.count_params(),
        "iterations": args.iterations,
        "tokens": args.iterations * args.batch_size * context,
        "validation_loss": round(float(validation_loss), 4),
        **quantized_losses,
        "nanogpt_validation_loss": 1.88,
        "train_seconds": round(seconds, 1),
        "curve": curve.points,
    }
    print("".join(vocabulary[i] for i in sample))
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
