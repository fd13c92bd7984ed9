"""Draws the performance page's charts from benchmarks/results/*.json when the site is built, beside the
tables made from the same files (results.py): a line `<!-- chart NAME TASK [FIELD] -->` becomes a bar
chart of FIELD (default: the rows' `value`) of each row of NAME.json's TASK (`-`: rows without a task),
and `<!-- curves NAME TASK -->` the learning curves the rows record (`curve`), as inline SVG images."""

from __future__ import annotations

import base64
import io
import json
import os
import re

RESULTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks", "results"
)
MARKER = re.compile(r"^<!-- chart (\S+) (\S+)(?: (\S+))? -->$", re.MULTILINE)
CURVES = re.compile(r"^<!-- curves (\S+) (\S+) -->$", re.MULTILINE)
# one colour per library, the same on every chart
COLOURS = {"keras_tfm": "#1f77b4", "keras_hub": "#ff7f0e", "hugging_face": "#2ca02c", "nanogpt": "#7f7f7f"}


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = CURVES.sub(lambda match: curves(*match.groups()), markdown)
    return MARKER.sub(lambda match: chart(*match.groups()), markdown)


def _rows(name: str, task: str) -> tuple[dict, list[dict]]:
    with open(os.path.join(RESULTS, f"{name}.json")) as file:
        record = json.load(file)
    rows = [row for row in record["results"] if row.get("task", "") == (task if task != "-" else "")]
    if not rows:
        raise ValueError(f"{name}.json has no rows of task {task!r}")
    return record, rows


def _image(svg: bytes, alt: str) -> str:
    return f"![{alt}](data:image/svg+xml;base64,{base64.b64encode(svg).decode()})\n"


def chart(name: str, task: str, field: str | None) -> str:
    record, rows = _rows(name, task)
    labels = [row.get("contender") or row.get("model") or row.get("run") for row in rows]
    field = field or "value"
    values = [float(row[field]) for row in rows]
    unit = rows[0].get("unit", field.replace("_", " ")) if field == "value" else field.replace("_", " ")
    title = record.get("tasks", {}).get(task) or record["benchmark"]
    caption = f"{rows[0].get('date', record['date'])}, {record['machine']}"
    references = {"nanoGPT": rows[0]["nanogpt_validation_loss"]} if "nanogpt_validation_loss" in rows[0] else {}
    svg = bars(labels, values, unit, f"{title}\n{caption}", references)
    return _image(svg, f"{title}: {unit} of each contender")


def curves(name: str, task: str) -> str:
    """Training (dashed) and validation (solid) loss against steps, one colour per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record, rows = _rows(name, task)
    rows = [row for row in rows if row.get("curve")]
    if not rows:
        return ""
    matplotlib.rcParams.update({"svg.hashsalt": "keras_tfm", "svg.fonttype": "none"})
    figure, axes = plt.subplots(figsize=(7.5, 3.6), dpi=100)
    for row, colour in zip(rows, ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")):
        label = row.get("model") or row.get("contender")
        axes.plot(row["curve"]["step"], row["curve"]["train_loss"], "--", color=colour, label=f"{label}, training")
        axes.plot(row["curve"]["step"], row["curve"]["validation_loss"], color=colour, label=f"{label}, validation")
    if "nanogpt_validation_loss" in rows[0]:
        axes.axhline(rows[0]["nanogpt_validation_loss"], color=COLOURS["nanogpt"], linestyle=":", linewidth=1)
        axes.text(
            rows[0]["curve"]["step"][0], rows[0]["nanogpt_validation_loss"], " nanoGPT's validation loss", fontsize=8
        )
    axes.set_xlabel("step", fontsize=8)
    axes.set_ylabel("loss", fontsize=8)
    axes.legend(fontsize=7)
    axes.set_title(
        f"Learning curves\n{rows[0].get('date', record['date'])}, {record['machine']}", fontsize=9, loc="left"
    )
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="svg", metadata={"Date": None})
    plt.close(figure)
    return _image(out.getvalue(), "learning curves: training and validation loss against steps")


def bars(labels: list[str], values: list[float], unit: str, title: str, references: dict) -> bytes:
    """A horizontal bar chart, one bar per label (coloured by its library), each with its value written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "keras_tfm"  # the same SVG for the same data
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a tenth of the size, and searchable
    figure, axes = plt.subplots(figsize=(7.5, 0.9 + 0.32 * len(labels)), dpi=100)
    colours = [next((c for key, c in COLOURS.items() if label.startswith(key)), "#9467bd") for label in labels]
    positions = range(len(labels))[::-1]
    axes.barh(list(positions), values, color=colours, height=0.7)
    for position, value in zip(positions, values):
        axes.text(value, position, f" {value:,.4g}", va="center", fontsize=8)
    for name, value in references.items():
        axes.axvline(value, color=COLOURS["nanogpt"], linestyle="--", linewidth=1)
        axes.text(value, len(labels) - 0.4, f" {name}: {value}", fontsize=8, color=COLOURS["nanogpt"])
    axes.set_yticks(list(positions), labels, fontsize=8)
    axes.set_xlabel(unit, fontsize=8)
    axes.set_xlim(0, max([*values, *references.values()]) * 1.18)
    axes.set_title(title, fontsize=9, loc="left")
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="svg", metadata={"Date": None})
    plt.close(figure)
    return out.getvalue()
