"""Runs every example notebook top to bottom with the small settings CI uses (KERAS_TFM_EXAMPLE_SMALL=1)
and saves it with its outputs, which the documentation site shows:

    python examples/execute.py [NOTEBOOK ...]
"""

from __future__ import annotations

import glob
import os
import sys

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))


def execute(path: str, timeout: int = 600) -> nbformat.NotebookNode:
    """The notebook at `path` run in a fresh kernel from its own directory, its old outputs dropped."""
    with open(path, encoding="utf-8") as file:
        book = nbformat.read(file, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    environment = {"KERAS_TFM_EXAMPLE_SMALL": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.path.dirname(HERE)}
    os.environ.update(environment)  # the kernel starts with this process's environment
    NotebookClient(book, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": HERE}}).execute()
    return book


if __name__ == "__main__":
    for path in sys.argv[1:] or sorted(glob.glob(os.path.join(HERE, "*.ipynb"))):
        book = execute(path)
        with open(path, "w", encoding="utf-8") as file:
            nbformat.write(book, file)
        print(f"{os.path.basename(path)}: {os.path.getsize(path) / 1000:.0f} KB with its outputs")
