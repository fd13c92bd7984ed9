"""Peak memory of the GPT recipe trained from token shards, on a small corpus and on one of --gigabytes
(made here by repeating tiny Shakespeare): with memory-mapped shards the training run's peak does not
grow with the corpus. Also the peak of preparing the shards (tokenized a piece at a time).

    python benchmarks/token_shards_memory.py --gigabytes 1
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from common import REPO, write_results

SHAKESPEARE = os.path.join(REPO, "..", "shared", "data", "tinyshakespeare", "input.txt")
FLAGS = "--num-layers 2 --num-heads 2 --hidden-dim 64 --max-length 64 --batch-size 16 --eval-batches 4 --steps 40 "
FLAGS += "--steps-per-epoch 20 --sample-every 0 --sample-tokens 8 --verbose 0"


def peak_megabytes(arguments: list[str]) -> float:
    """Runs the GPT recipe with `arguments` under /usr/bin/time and returns its peak resident memory."""
    command = ["/usr/bin/time", "-f", "peak_kb=%M", sys.executable, os.path.join(REPO, "recipes", "gpt_lm.py")]
    done = subprocess.run(
        command + arguments, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    if done.returncode != 0:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
    return int(re.search(r"peak_kb=(\d+)", done.stderr)[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--work-dir", default=None, help="where the corpus and shards go (default: a temporary one)")
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="token_shards_")
    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()
    big = os.path.join(work, "corpus.txt")
    if not os.path.exists(big):
        with open(big, "w", encoding="utf-8") as file:
            for _ in range(int(args.gigabytes * 1e9 / len(text)) + 1):
                file.write(text)
    rows = []
    for name, corpus in (("tiny Shakespeare", SHAKESPEARE), (f"{args.gigabytes:g} GB corpus", big)):
        shards = os.path.join(work, f"shards-{len(rows)}")
        prepared = peak_megabytes(
            ["--data", corpus, "--token-shards", shards, "--prepare-only", "--output-dir", shards + "-run"]
        )
        trained = peak_megabytes(["--token-shards", shards, "--output-dir", shards + "-run", *FLAGS.split()])
        tokens = sum(os.path.getsize(os.path.join(shards, f)) // 2 for f in os.listdir(shards) if f.endswith(".bin"))
        rows.append(
            {"corpus": name, "tokens": tokens, "prepare_peak_MB": round(prepared), "train_peak_MB": round(trained)}
        )
        print(rows[-1], flush=True)
    write_results("token_shards_memory", rows, tasks={"": "Peak memory of training from token shards (GPT recipe)"})


if __name__ == "__main__":
    main()
