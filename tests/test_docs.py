"""The documentation runs as written: every Python example of the README and of docs/ executes, the
README's results table is the one made from benchmarks/results/, and the example notebooks run top to
bottom (with their small settings)."""

import glob
import json
import os
import re
import subprocess
import sys

import keras
import pytest

import keras_tfm

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
    """The server's client examples (Python, and `curl` in bash) talk to a stand-in for the page's SmolLM2
    server: a tiny chat model served under its name, port and key."""
    from tests.checks import chat_model
    from tests.serve.helpers import Server

    assert _blocks(page)
    monkeypatch.setenv("KERAS_TFM_API_KEY", "stand-in")
    with Server(chat_model(max_length=128), name="SmolLM2-135M-Instruct", port=8000, api_key="stand-in"):
        _run_page(page, tmp_path, monkeypatch)
        for block in [block for block in SHELL_BLOCK.findall(_read(page)) if block.startswith("curl ")]:
            run = subprocess.run(["bash", "-c", block], capture_output=True, text=True, timeout=120)
            assert run.returncode == 0 and json.loads(run.stdout)["choices"][0]["message"]["role"] == "assistant", (
                f"{page}: {block}\n{run.stdout}{run.stderr}"
            )


def _embedder_stand_in(directory: str) -> None:
    """A small sentence-transformers checkpoint with a real WordPiece vocabulary, under a Hub id's name."""
    from keras_tfm.data import WordPieceTokenizer
    from tests.checks import bert_vocabulary

    tokenizer = WordPieceTokenizer(bert_vocabulary(_read("docs/embeddings.md")))
    encoder = keras_tfm.Bert(vocabulary_size=tokenizer.vocabulary_size, max_length=64, num_layers=1, num_heads=2,
                             hidden_dim=16, intermediate_dim=32)  # fmt: skip
    embedder = keras_tfm.SentenceEmbedder(encoder, max_sequence_length=32)
    embedder.tokenizer = tokenizer
    keras_tfm.save_huggingface(embedder, directory)


def _clip_stand_in(directory: str) -> None:
    from tests.convert.test_clip import write_clip_checkpoint

    write_clip_checkpoint(directory)


def _siglip_stand_in(directory: str) -> None:
    import pathlib

    from tests.convert.test_siglip import write_siglip_checkpoint

    write_siglip_checkpoint(pathlib.Path(directory))


# Hub checkpoints a page loads, as small stand-ins written under the id's name (a local directory comes first)
STAND_INS = {
    "sentence-transformers/all-MiniLM-L6-v2": _embedder_stand_in,
    "openai/clip-vit-base-patch32": _clip_stand_in,
    "google/siglip-base-patch16-224": _siglip_stand_in,
}


def _run_page(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for hub_id, write in STAND_INS.items():
        if hub_id in _read(page):
            write(str(tmp_path / hub_id))
    namespace: dict = {"__name__": "__docs__"}
    try:
        for number, block in enumerate(_blocks(page), 1):
            try:
                exec(compile(block, f"{page} (Python block {number})", "exec"), namespace)
            except Exception as error:
                raise AssertionError(f"{page}: Python block {number} failed: {error!r}\n{block}") from error
    finally:
        # the layer names a page used are free again, as in a new process; without a full collection, which
        # costs a second a page in a process that has run most of the suite
        keras.backend.clear_session(free_memory=False)


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


SHELL_BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.MULTILINE | re.DOTALL)
RECIPE_NAMES = sorted(glob.glob("*.py", root_dir=os.path.join(REPO, "recipes")))


def _shell_commands(text: str) -> list[list[str]]:
    """The commands of shell text, as words: continued lines joined, comments and `VAR=value` prefixes dropped."""
    import shlex

    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def _documented_commands() -> list[tuple[str, list[str]]]:
    """Every command of the pages' bash blocks and of the recipes' descriptions (what `--help` prints)."""
    from tests.recipes.helpers import recipe_function

    found = [
        (page, words)
        for page in PAGES
        for block in SHELL_BLOCK.findall(_read(page))
        for words in _shell_commands(block)
    ]
    for name in RECIPE_NAMES:
        described = recipe_function(name, "__doc__")
        examples = "\n".join(
            line for line in described.replace("\\\n", " ").splitlines() if line.strip().startswith("python ")
        )
        found += [(f"recipes/{name}", words) for words in _shell_commands(examples)]
    return found


def _read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as file:
        return file.read()


@pytest.mark.backend_independent
def test_every_documented_command_names_what_exists():
    """The shell commands a reader copies: a recipe's or the server's flags parse (with the values the page
    gives), installs name the package's extras, scripts exist. A command of another kind fails the test
    until it is checked here. (The `curl` example runs against a server: the export pages' test.)"""
    import contextlib
    import io

    import tomllib

    from keras_tfm.serve.__main__ import parser as server_flags
    from tests.recipes.helpers import recipe_function

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as file:
        extras = set(tomllib.load(file)["project"]["optional-dependencies"])
    commands = _documented_commands()
    assert len(commands) >= 20
    for where, words in commands:
        shown = f"{where}: {' '.join(words)}"
        if words[0] == "python" and words[1].startswith("recipes/"):
            name = words[1].removeprefix("recipes/")
            sizes = recipe_function(name, "model_sizes")()
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # --help prints and exits 0
                    recipe_function(name, "flags")(sizes).parse_args(words[2:])
            except SystemExit as error:
                assert error.code == 0, f"{shown}: the recipe refuses these flags"
        elif words[:3] == ["python", "-m", "keras_tfm.serve"]:
            server_flags().parse_args(words[3:])
        elif words[:3] == ["pip", "install", "-e"]:
            named = set(re.fullmatch(r"\.\[(.*)\]", words[3]).group(1).split(","))
            assert named <= extras, f"{shown}: no extra {sorted(named - extras)}"
        elif words[0] in ("bash", "source"):
            assert os.path.isfile(os.path.join(REPO, words[1])) or words[1] == ".venv/bin/activate", shown
        else:
            assert words[0] in ("export", "curl"), f"{shown}: a command this test does not check"
