"""The suite's result from `.ci/test`'s reports: each process's counts and CPU time, and where the time
went. `python .ci/suite_record.py REPORTS [FILE]` prints them (exit 1 if a test failed or none passed)
and, with FILE, writes them there as JSON for `benchmarks/ci.py`."""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def _seconds(text: str) -> float:
    """Bash's `times` field (`12m3.456s`) in seconds."""
    minutes, seconds = re.fullmatch(r"(\d+)m([\d.]+)s", text).groups()
    return int(minutes) * 60 + float(seconds)


def jobs(reports: str) -> list[dict]:
    """One row per pytest process: its counts, wall and CPU (user + system) seconds."""
    rows = []
    for path in sorted(glob.glob(os.path.join(reports, "*.xml"))):
        job = os.path.basename(path)[:-4]
        row = {"job": job, "passed": 0, "failed": 0, "skipped": 0}
        for suite in ET.parse(path).getroot().iter("testsuite"):
            tests, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
            skipped = int(suite.get("skipped"))
            row["passed"] += tests - failed - skipped
            row["failed"] += failed
            row["skipped"] += skipped
        for name, key in (("wall", "wall_s"), ("times", "cpu_s")):
            file = os.path.join(reports, f"{job}.{name}")
            if os.path.isfile(file):
                text = open(file).read().strip().splitlines()[-1].split()  # `times`: the children's line
                row[key] = int(text[0]) if name == "wall" else round(sum(map(_seconds, text)))
        rows.append(row)
    return rows


def slowest_files(reports: str, count: int = 15) -> list[dict]:
    """The test files whose tests took the most time, summed over the processes (pytest's own timings:
    wall time, with the six processes sharing the cores)."""
    times: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    for path in glob.glob(os.path.join(reports, "*.xml")):
        backend = os.path.basename(path).split(":")[0]
        for case in ET.parse(path).getroot().iter("testcase"):
            times[case.get("classname").replace(".", "/") + ".py"][backend] += float(case.get("time") or 0)
    ranked = sorted(times.items(), key=lambda item: -sum(item[1].values()))[:count]
    return [
        {
            "file": name,
            **{b: round(spent.get(b, 0)) for b in ("tensorflow", "jax", "torch")},
            "all": round(sum(spent.values())),
        }
        for name, spent in ranked
    ]


def main(reports: str, record: str = "") -> int:
    rows = jobs(reports)
    for row in rows:
        cpu = f", CPU {row['cpu_s']} s" if "cpu_s" in row else ""
        print(f"{row['job']}: {row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped{cpu}")
    passed, failed, skipped = (sum(row[key] for row in rows) for key in ("passed", "failed", "skipped"))
    cpu = sum(row.get("cpu_s", 0) for row in rows)
    print(f"suite CPU time (user + system of the {len(rows)} processes): {cpu} s ({cpu / 60:.1f} min)")
    print(f"all: {passed} passed, {failed} failed, {skipped} skipped")
    if record:
        with open(record, "w") as file:
            json.dump({"jobs": rows, "cpu_s": cpu, "slowest_files": slowest_files(reports)}, file, indent=2)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
