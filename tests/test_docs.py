"""The documentation runs as written: every Python example of the README and of docs/ executes, the
README's results table is the one made from benchmarks/results/, and the example notebooks run top to
bottom (with their small settings)."""

import glob
import json
import os
import re
import sys

import keras
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(glob.glob("docs/**/*.md", root_dir=REPO, recursive=True))]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _blocks(page: str) -> list[str]:
    with open(os.path.join(REPO, page), encoding="utf-8") as file:
        return BLOCK.findall(file.read())


# pages whose examples export: they run on the backend that writes every format
TENSORFLOW_PAGES = ["docs/deploy.md"]


@pytest.mark.backend_independent
@pytest.mark.parametrize("page", [page for page in PAGES if _blocks(page) and page not in TENSORFLOW_PAGES])
def test_every_python_example_of_a_page_runs_as_written(page, tmp_path, monkeypatch):
    """The blocks of one page run in order in one namespace, as a reader pastes them, in an empty
    directory (they write their files there), offline."""
    _run_page(page, tmp_path, monkeypatch)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="export's examples write every format there")
@pytest.mark.parametrize("page", TENSORFLOW_PAGES)
def test_every_export_example_runs_as_written_on_tensorflow(page, tmp_path, monkeypatch):
    """The server's client examples talk to a stand-in for the page's SmolLM2 server: a tiny chat model
    served under its name, port and key."""
    from tests.test_cli import chat_model
    from tests.test_serve import Server

    assert _blocks(page)
    monkeypatch.setenv("KERAS_TFM_API_KEY", "stand-in")
    with Server(chat_model(max_length=64), name="SmolLM2-135M-Instruct", port=8000, api_key="stand-in"):
        _run_page(page, tmp_path, monkeypatch)


def _run_page(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__docs__"}
    try:
        for number, block in enumerate(_blocks(page), 1):
            try:
                exec(compile(block, f"{page} (Python block {number})", "exec"), namespace)
            except Exception as error:
                raise AssertionError(f"{page}: Python block {number} failed: {error!r}\n{block}") from error
    finally:
        keras.backend.clear_session()  # the layer names a page used are free again, as in a new process


@pytest.mark.backend_independent
def test_the_readme_results_are_the_benchmarks_current_files():
    sys.path.insert(0, os.path.join(REPO, "docs", "hooks"))
    try:
        import results
    finally:
        sys.path.pop(0)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as file:
        readme = file.read()
    table = readme.split("<!-- summary -->\n", 1)[1].split("<!-- /summary -->", 1)[0]
    assert table == results.summary(), "run `python docs/hooks/results.py` and paste its table into the README"
    for path in glob.glob(os.path.join(REPO, "benchmarks", "results", "*.json")):
        with open(path) as file:
            record = json.load(file)
        assert {"date", "machine", "command", "results"} <= set(record), path
        assert results.tables(os.path.basename(path)[:-5]).count("|---") >= 1, path


NOTEBOOKS = sorted(glob.glob("examples/*.ipynb", root_dir=REPO))
EXAMPLES = os.path.join(REPO, "examples")  # where a reader opens them: they find ../../shared/data from there


@pytest.mark.backend_independent
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_example_notebook_runs_top_to_bottom(notebook):
    """Committed with the outputs of a small run (what the site shows: `python examples/execute.py`), kept
    small (no progress bars); run again here in a fresh kernel on this process's backend, with the
    notebooks' small settings (KERAS_TFM_EXAMPLE_SMALL=1): a cell that fails, fails the test."""
    import importlib.util

    path = os.path.join(REPO, notebook)
    with open(path, encoding="utf-8") as file:
        committed = json.load(file)
    outputs = [output for cell in committed["cells"] for output in cell.get("outputs", [])]
    assert outputs, f"{notebook} is committed without its outputs: run python examples/execute.py"
    shown = json.dumps(outputs)
    assert os.path.getsize(path) < 100_000 and "\\r" not in shown and "it/s]" not in shown, notebook
    spec = importlib.util.spec_from_file_location("execute", os.path.join(EXAMPLES, "execute.py"))
    execute = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(execute)
    book = execute.execute(path)  # raises at the first cell that fails
    assert [cell.cell_type for cell in book.cells] == [cell["cell_type"] for cell in committed["cells"]]
