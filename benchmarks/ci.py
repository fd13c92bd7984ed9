"""What CI costs: `bash .ci/run` from a clean clone of HEAD (beside this checkout's `../shared`), timed
whole, with each suite process's CPU time; written to benchmarks/results/ci.json, which the development
page shows.

    python benchmarks/ci.py          # about 20-27 minutes on 2 cores: the machine should be otherwise idle
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, write_results  # noqa: E402

BUDGET_S, CPU_GOAL_S = 18 * 60, 25 * 60  # the whole run on an ordinary day; the suite's CPU time


def main() -> int:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(["git", "clone", "--quiet", REPO, os.path.join(work, "main")], check=True)
        os.symlink(os.path.abspath(os.path.join(REPO, "..", "shared")), os.path.join(work, "shared"))
        record = os.path.join(work, "suite.json")
        start = time.perf_counter()
        run = subprocess.run(
            ["bash", ".ci/run"],
            cwd=os.path.join(work, "main"),
            env=dict(os.environ, CI="true", CI_RECORD=record),
            capture_output=True,
            text=True,
        )
        seconds = round(time.perf_counter() - start)
        os.makedirs(os.path.join(REPO, "runs"), exist_ok=True)
        with open(os.path.join(REPO, "runs", "ci.log"), "w") as log:  # the whole output, not committed
            log.write(run.stdout + run.stderr)
        suite = json.load(open(record)) if os.path.isfile(record) else {"jobs": [], "cpu_s": 0, "slowest_files": []}
    minimal = re.search(r"=== minimal install stage: (\d+) s", run.stdout)
    passed = sum(job["passed"] for job in suite["jobs"])
    total = {
        "task": "total",
        "commit": commit.stdout.strip(),
        "exit": run.returncode,
        "run_s": seconds,
        "run": f"{seconds // 60} min {seconds % 60} s",
        "budget": f"{BUDGET_S // 60} min",
        "minimal_installs_s": int(minimal.group(1)) if minimal else None,
        "suite_cpu_s": suite["cpu_s"],
        "suite_cpu": f"{suite['cpu_s'] / 60:.1f} min",
        "cpu_goal": f"{CPU_GOAL_S // 60} min",
        "passed": passed,
    }
    rows = [total, *({"task": "jobs", **job} for job in suite["jobs"])]
    rows += [{"task": "files", **row} for row in suite["slowest_files"]]
    tasks = {
        "total": "The clean-clone `bash .ci/run`: its wall time, the minimal installs, the suite's CPU time",
        "jobs": "Each suite process (they run at once on the two cores): wall and CPU (user + system) seconds",
        "files": "The test files that took longest: seconds of pytest's timings, per backend process",
    }
    write_results("ci", rows, tasks)
    print(json.dumps(total))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
