"""What `remat=True` (blocks recomputed in the backward pass) costs and saves on this machine, on each
Keras backend: a GPT of nanoGPT's Shakespeare size (6 layers, 6 heads, 384 wide, vocabulary 65) at
context 1024, batch 8, dropout 0.1, trained with AdamW.

    python benchmarks/remat.py                  # both tables
    python benchmarks/remat.py --only memory    # or: --only speed

Memory: the largest resident memory of the process during three training steps (read every 2 ms),
less its resident memory before them, with the model and optimizer built: what the steps took (XLA's
compilation included, in the first step, on JAX and TensorFlow). Speed: tokens/s, the faster of the
second and third steps.
"""

from __future__ import annotations

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, Timer, main  # noqa: E402

CONFIG = dict(vocabulary_size=65, max_length=1024, num_layers=6, num_heads=6, hidden_dim=384, dropout=0.1)
BATCH = 8


def _resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakMemory:
    """The largest resident memory seen while the `with` block runs."""

    def __enter__(self):
        self.peak, self._running = _resident_mb(), True
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while self._running:
            self.peak = max(self.peak, _resident_mb())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._running = False
        self._thread.join()
        self.peak = max(self.peak, _resident_mb())


def worker(mode: str, task: str) -> dict:
    import keras
    import numpy as np

    import keras_tfm

    keras.utils.set_random_seed(0)
    model = keras_tfm.GPT(**CONFIG, remat=mode == "remat")
    model.compile(keras.optimizers.AdamW(1e-4), keras_tfm.TokenCrossEntropy(), jit_compile="auto")
    ids = np.random.default_rng(0).integers(0, 65, size=(BATCH, CONFIG["max_length"])).astype("int32")
    model.build()
    model.optimizer.build(model.trainable_variables)
    before = _resident_mb()
    seconds = []
    with PeakMemory() as memory:  # the first step compiles (XLA) and makes the buffers later steps reuse
        for _ in range(3):
            with Timer() as timer:
                model.train_on_batch(ids, ids)
            seconds.append(timer.seconds)
    if task == "memory":
        return {"value": memory.peak - before, "method": "train_on_batch"}
    rates = [BATCH * CONFIG["max_length"] / s for s in seconds[1:]]
    return {"value": max(rates), "windows": rates, "method": "train_on_batch"}


if __name__ == "__main__":
    main(
        __doc__,
        os.path.abspath(__file__),
        worker,
        {
            "memory": ("GPT 6 x 384, context 1024, batch 8: peak memory of three training steps", "MB"),
            "speed": ("GPT 6 x 384, context 1024, batch 8: training speed", "tokens/s"),
        },
        contenders=[(f"{mode} ({backend})", mode, backend) for backend in BACKENDS for mode in ("stored", "remat")],
        baselines={f"stored ({backend})": f"stored ({backend})" for backend in BACKENDS},
        same_backend={"memory": "stored", "speed": "stored"},
    )
