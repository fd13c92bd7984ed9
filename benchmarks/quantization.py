"""What `model.quantize` buys on this machine: GPT-2 small (random weights, context 256) in float32,
int8 and int4, on each Keras backend: the size of its `.keras` file, and greedy generation speed;
and what quantizing costs: GPT-2 small's int8 quantization by keras_tfm's `quantize` against Keras'
own `keras.Model.quantize` on the same model (Keras collects garbage after every kernel it replaces).

    python benchmarks/quantization.py                 # the three tables
    python benchmarks/quantization.py --only generate # or: --only size, --only quantize

Generation: batch 1, a 4-token prompt, 32 new tokens, best of 3 calls after a compiling one. What
quantization does to a trained model's loss is in `benchmarks/gpt_quality.py`.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, Timer, main  # noqa: E402

GENERATE = dict(prompt=[464, 2068, 7586, 21831], new_tokens=32, repeats=3)
MODES = ("float32", "int8", "int4")


def worker(mode: str, task: str) -> dict:
    import keras

    import keras_tfm

    keras.utils.set_random_seed(0)
    model = keras_tfm.gpt2_small(max_length=256)
    model.build()
    if task == "quantize":  # millions of float parameters quantized per second
        parameters = model.count_params() / 1e6
        with Timer() as timer:
            (model.quantize if mode == "keras_tfm" else lambda mode: keras.Model.quantize(model, mode))("int8")
        return {"value": parameters / timer.seconds, "method": f"{timer.seconds:.1f} s"}
    if mode != "float32":
        model.quantize(mode)
    if task == "size":
        path = os.path.join(tempfile.mkdtemp(), "model.keras")
        model.save(path)
        return {"value": os.path.getsize(path) / 1e6}
    model.generate([GENERATE["prompt"]], max_new_tokens=GENERATE["new_tokens"])  # compile
    windows = []
    for _ in range(GENERATE["repeats"]):
        with Timer() as timer:
            model.generate([GENERATE["prompt"]], max_new_tokens=GENERATE["new_tokens"])
        windows.append(GENERATE["new_tokens"] / timer.seconds)
    return {"value": max(windows), "windows": windows, "method": "generate"}


if __name__ == "__main__":
    main(
        __doc__,
        os.path.abspath(__file__),
        worker,
        {
            "size": ("GPT-2 small .keras file", "MB"),
            "generate": ("GPT-2 small greedy generation", "new tokens/s"),
            "quantize": ("GPT-2 small int8 quantization", "M parameters/s"),
        },
        contenders=[(f"{mode} ({backend})", mode, backend) for backend in BACKENDS for mode in MODES],
        baselines={f"float32 ({backend})": f"float32 ({backend})" for backend in BACKENDS},
        same_backend={"size": "float32", "generate": "float32", "quantize": "keras"},
        task_contenders={
            "quantize": (
                [(f"{how} ({backend})", how, backend) for backend in BACKENDS for how in ("keras_tfm", "keras")],
                {f"Keras ({backend})": f"keras ({backend})" for backend in BACKENDS},
            )
        },
    )
