"""How soon the server is ready: the SmolLM2-135M shape (random weights, float32), a server engine of 16 rows
warmed up for requests of up to 128 positions, greedy rows and rows that sample (temperature 1), from a fresh
process. The engine compiles what one row needs first (a chunk at the longest cache length) and says it is ready,
then compiles the other shapes beside; recorded: the seconds to the model's load, to ready, and until every planned
shape is compiled, the count of shapes each way, the process's peak resident memory, the memory of the runtime
alone (after its imports) and of the weights. JAX starts twice: first with an empty directory of compiled
programs, then again reading it (`keep_compiled_programs`, what the server does by default).

    python benchmarks/warm_up.py [--backends jax torch tensorflow]     # each in a process of its own
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, write_results  # noqa: E402

ROWS, LENGTH = 16, 128


def resident_mb() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def measure() -> dict:
    start = time.monotonic()
    import keras

    import keras_tfm
    from keras_tfm.generation import compiled
    from keras_tfm.generation.config import GenerationConfig
    from keras_tfm.serve.engine import Engine

    imported_mb = resident_mb()
    compiled.keep_compiled_programs(os.environ.get("KERAS_TFM_BENCHMARK_CACHE"))  # as the server does
    keras_tfm.compat.torch_server_process()  # PyTorch's threads and traces as the server sets them
    model = keras_tfm.smollm2_135m(max_length=2048)
    model.build()
    loaded = time.monotonic() - start
    lines = []
    engine = Engine(model, ROWS, warm_up_length=LENGTH, warm_up_configs=(GenerationConfig(temperature=1.0),),
                    progress=lines.append)  # fmt: skip
    engine.ready.wait()
    ready = time.monotonic() - start
    before = len(lines)
    while sum(line.startswith("warm-up beside") for line in lines) < len(engine._warm_up[1]):
        time.sleep(0.1)
    compiled = time.monotonic() - start
    engine.close()
    return {
        "task": "warm_up",
        "backend": keras.backend.backend(),
        "start": os.environ["KERAS_TFM_BENCHMARK_START"],
        "load_s": round(loaded, 1),
        "ready_s": round(ready, 1),
        "all_compiled_s": round(compiled, 1),
        "shapes_before_ready": before,
        "shapes_beside": len(lines) - before,
        "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "imported_mb": imported_mb,  # the runtime alone: Python, Keras and the backend
        "weights_mb": sum(w.numpy().nbytes for w in model.weights) // 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # this process: one backend
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    rows = []
    for backend in args.backends:
        with tempfile.TemporaryDirectory() as cache:  # JAX's programs kept on disk, as the server keeps them
            environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
            environment.pop("JAX_COMPILATION_CACHE_DIR", None)
            for start in ("first", "again")[: 2 if backend == "jax" else 1]:  # the others keep none
                environment.update(KERAS_TFM_BENCHMARK_CACHE=cache, KERAS_TFM_BENCHMARK_START=start)
                done = subprocess.run([sys.executable, __file__, "--measure"], env=environment, capture_output=True,
                                      text=True, check=True)  # fmt: skip
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    title = f"SmolLM2-135M shape, a server engine of {ROWS} rows warmed up for {LENGTH} positions"
    write_results("warm_up", rows, tasks={"warm_up": title})


if __name__ == "__main__":
    main()
