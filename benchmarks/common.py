"""Side-by-side benchmarking: every contender runs in its own process (one Keras backend per process),
prints one JSON line, and the driver prints a table with ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_worker(script: str, backend: str, args: list[str], timeout: int = 900) -> dict:
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, script, "--worker", *args], env=env, capture_output=True,
                            text=True, timeout=timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"error": (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]}
    return json.loads(lines[-1])


def report(result: dict) -> None:
    print(json.dumps(result), flush=True)


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def print_table(title: str, unit: str, rows: list[tuple[str, dict]], baselines: dict[str, str]) -> None:
    """rows: (name, result with 'value'); baselines: column title -> name of the row to divide by."""
    print(f"\n### {title}\n")
    header = f"| contender | {unit} | " + " | ".join(f"vs {b}" for b in baselines) + " |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    values = {name: r.get("value") for name, r in rows}
    for name, result in rows:
        if "error" in result:
            print(f"| {name} | failed: {result['error'][0][:80]} |" + " |" * len(baselines))
            continue
        ratios = []
        for base in baselines.values():
            b = values.get(base)
            ratios.append(f"{result['value'] / b:.2f}x" if b else "-")
        print(f"| {name} | {result['value']:,.0f} | " + " | ".join(ratios) + " |")
