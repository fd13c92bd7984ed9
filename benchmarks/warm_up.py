"""How soon the server is ready: the SmolLM2-135M shape (random weights, float32), a server engine of 16 rows
warmed up for requests of up to 128 positions, greedy rows and rows that sample (temperature 1), from a fresh
process. The engine compiles the shapes of one row first and says it is ready, then compiles the other row
counts beside; recorded: the seconds to the model's load, to ready, and until every planned shape is compiled,
the count of shapes each way, and the process's peak resident memory.

    KERAS_BACKEND=jax python benchmarks/warm_up.py          # one backend per process; the file keeps each
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, write_results  # noqa: E402

ROWS, LENGTH = 16, 128


def measure() -> dict:
    start = time.monotonic()
    import keras

    import keras_tfm
    from keras_tfm.generation.config import GenerationConfig
    from keras_tfm.serve.engine import Engine

    model = keras_tfm.smollm2_135m(max_length=2048)
    model.build()
    loaded = time.monotonic() - start
    lines = []
    engine = Engine(model, ROWS, warm_up_length=LENGTH, warm_up_configs=(GenerationConfig(temperature=1.0),),
                    progress=lines.append)  # fmt: skip
    engine.ready.wait()
    ready = time.monotonic() - start
    before = len(lines)
    while sum(line.startswith("warm-up beside") for line in lines) < len(engine._warm_up) - before:
        time.sleep(0.1)
    compiled = time.monotonic() - start
    engine.close()
    return {
        "task": "warm_up",
        "backend": keras.backend.backend(),
        "load_s": round(loaded, 1),
        "ready_s": round(ready, 1),
        "all_compiled_s": round(compiled, 1),
        "shapes_before_ready": before,
        "shapes_beside": len(lines) - before,
        "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def main() -> None:
    row = measure()
    print(json.dumps(row))
    path = os.path.join(REPO, "benchmarks", "results", "warm_up.json")
    kept = []
    if os.path.exists(path):
        with open(path) as file:
            kept = [old for old in json.load(file)["results"] if old["backend"] != row["backend"]]
    rows = sorted([*kept, row], key=lambda r: ["jax", "torch", "tensorflow"].index(r["backend"]))
    title = f"SmolLM2-135M shape, a server engine of {ROWS} rows warmed up for {LENGTH} positions"
    write_results("warm_up", rows, tasks={"warm_up": title})


if __name__ == "__main__":
    main()
