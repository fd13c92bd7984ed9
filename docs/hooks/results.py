"""Makes the performance page's tables from benchmarks/results/*.json at build time, so that the page and
the benchmarks cannot disagree: a line `<!-- results NAME [TASK] -->` becomes the tables of NAME.json (of
its rows of TASK only, where one is named)."""

from __future__ import annotations

import json
import os
import re

RESULTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks", "results"
)
MARKER = re.compile(r"^<!-- results (\S+)(?: (\S+))? -->$", re.MULTILINE)
# Fields that say how a row was measured, not what: in the JSON, not in the tables.
HIDDEN = {
    "task",
    "unit",
    "windows",
    "rounds",
    "command",
    "date",
    "error",
    "contender",
    "value",
    "backend_note",
    "curve",
    "train_on_batch",  # each way of training's own windows: `method` names the faster, whose rate `value` is
    "fit",
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda match: tables(*match.groups()), markdown)


def tables(name: str, only: str | None = None) -> str:
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path) as file:
        record = json.load(file)
    rows = record["results"]
    tasks = [task for task in dict.fromkeys(row.get("task", "") for row in rows) if only in (None, task)]
    out = []
    for task in tasks:
        task_rows = [row for row in rows if row.get("task", "") == task]
        title = record.get("tasks", {}).get(task) or task or record["benchmark"]
        first = task_rows[0]
        when = first.get("date", record["date"])
        command = first.get("command", record["command"])
        out.append(f"**{title}**  \n_{when}, {record['machine']}: `{command}`_\n")
        out.append(table(task_rows, record.get("baselines", {}).get(task, "keras_hub")))
    versions = record.get("versions")
    if versions:
        out.append("_Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f" (`{name}.json`)_\n")
    return "\n".join(out)


def table(rows: list[dict], same_backend_baseline: str) -> str:
    if "contender" not in rows[0]:  # a table of records: every field a column
        columns = list(dict.fromkeys(key for row in rows for key in row if key not in HIDDEN))
        return _markdown(columns, [[row.get(c, "") for c in columns] for row in rows])
    unit = rows[0].get("unit", "value")
    extra = list(dict.fromkeys(key for row in rows for key in row if key not in HIDDEN))
    by_name = {row["contender"]: row for row in rows}
    # the Hugging Face reference (transformers, or its sentence-transformers), compared with every row
    hugging_face = next((name for name in by_name if name.startswith(("hugging_face", "sentence_transformers"))), None)
    columns = ["contender", unit, *extra]
    same = any(_backend_baseline(name, same_backend_baseline) in by_name for name in by_name)
    if same:
        columns.append(f"vs {same_backend_baseline}, same backend")
    if hugging_face:
        columns.append(f"vs {hugging_face}")
    body = []
    for row in rows:
        cells = [row["contender"], row.get("value"), *(row.get(key, "") for key in extra)]
        if same:
            base = by_name.get(_backend_baseline(row["contender"], same_backend_baseline))
            cells.append(_ratio(row, base))
        if hugging_face:
            cells.append(_ratio(row, by_name[hugging_face]))
        body.append(cells)
    return _markdown(columns, body)


def _backend_baseline(name: str, prefix: str) -> str:
    backend = re.search(r"\((\w+)\)$", name)
    return f"{prefix} ({backend.group(1)})" if backend else ""


def _ratio(row: dict, base: dict | None) -> str:
    if not base or not base.get("value") or row.get("value") is None:
        return ""
    return f"{row['value'] / base['value']:.2f}x"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 1 else f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def _markdown(columns: list[str], body: list[list]) -> str:
    header = [c if c.startswith("vs ") else c.replace("_", " ") for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in body]
    return "\n".join(lines) + "\n"


# The README's table of current results: (what, file, task, our row, keras-hub's row, Hugging Face's row).
# keras_tfm and keras-hub are each shown on their fastest backend in the file, whatever the row names.
SUMMARY = [
    (
        "Llama-family generation, SmolLM2-135M shape (new tokens/s)",
        "decoder_lm",
        "generate",
        "keras_tfm (torch)",
        "keras_hub (torch)",
        "hugging_face (torch)",
    ),
    (
        "GPT generation, 200 tokens (new tokens/s)",
        "gpt",
        "generate",
        "keras_tfm (jax)",
        "keras_hub (jax)",
        "hugging_face (torch)",
    ),
    (
        "BERT masked-LM training (tokens/s)",
        "bert",
        "train",
        "keras_tfm (torch)",
        "keras_hub (torch)",
        "hugging_face (torch)",
    ),
    (
        "ViT training (images/s)",
        "vit",
        "train",
        "keras_tfm (tensorflow)",
        "keras_hub (tensorflow)",
        "hugging_face (torch)",
    ),
    (
        "GPT training (tokens/s)",
        "gpt",
        "train",
        "keras_tfm (tensorflow)",
        "keras_hub (tensorflow)",
        "hugging_face (torch)",
    ),
    (
        "Llama-3.2-1B-shaped decoding in bfloat16, batch 1, against transformers' compiled static cache (new tokens/s)",
        "gpu_decoding",
        "batch_1",
        "keras_tfm (jax)",
        None,
        "hugging_face static cache (torch)",
    ),
    (
        "Sentence embeddings, all-MiniLM-L6-v2 shape, against sentence-transformers (texts/s)",
        "embeddings",
        "embed",
        "keras_tfm (torch)",
        None,
        "sentence_transformers (torch)",
    ),
    (
        "Translator beam search (sentences/s)",
        "translator",
        "translate",
        "keras_tfm (jax)",
        None,
        "hugging_face marian (torch)",
    ),
]


def _fastest(rows: dict, contender: str) -> str:
    """The row of the same library (the name before its backend) with the largest value."""
    library = contender.split(" (")[0] + " ("
    return max((name for name in rows if name.startswith(library)), key=lambda name: rows[name]["value"])


def summary() -> str:
    """The README's results table, from the same files as the performance page."""
    lines = ["| result | machine | keras_tfm | keras-hub | Hugging Face |", "|---|---|---:|---:|---:|"]
    for what, name, task, ours, hub, hugging_face in SUMMARY:
        record = _record(name)
        rows = {row["contender"]: row for row in record["results"] if row.get("task") == task}
        ours = _fastest(rows, ours)
        hub = hub and _fastest(rows, hub)
        cells = [_machine(record), _cell(rows[ours]["value"]) + f" ({ours.split('(')[1][:-1]})"]
        for other in (hub, hugging_face):
            backend = f"{other.split('(')[1][:-1]}, " if other else ""
            cells.append(
                f"{_cell(rows[other]['value'])} ({backend}{rows[ours]['value'] / rows[other]['value']:.2f}x)"
                if other
                else ""
            )
        lines.append(f"| [{what}](docs/performance.md) | " + " | ".join(cells) + " |")
    record = _record("gpt_quality")
    for row in record["results"]:
        lines.append(
            f"| [`{row['model']}()`, tiny Shakespeare validation loss](docs/performance.md#quality) | "
            f"{_machine(record)} | {row['validation_loss']:.3f} | | nanoGPT: {row['nanogpt_validation_loss']} |"
        )
    record = _record("recipes")
    for row in record["results"]:
        lines.append(
            f"| [{row['run']}: {row['metric']}](docs/performance.md#quality) | {_machine(record)} | "
            f"{row['result']} | | target {row['target']} |"
        )
    return "\n".join(lines) + "\n"


def _record(name: str) -> dict:
    with open(os.path.join(RESULTS, f"{name}.json")) as file:
        return json.load(file)


def _machine(record: dict) -> str:
    """The processor or accelerator a record was measured on, shortly: "AMD EPYC", "NVIDIA H200"."""
    first = record["machine"].split(",")[0]
    return re.sub(r"\(R\)| Processor", "", first).strip()


if __name__ == "__main__":  # python docs/hooks/results.py: the README's table
    print(summary(), end="")
