"""Every example in a docstring, which the API reference shows, runs as written (doctest, offline)."""

import doctest
import importlib
import pkgutil

import keras
import numpy as np
import pytest

import keras_tfm

FINDER = doctest.DocTestFinder(exclude_empty=True)


def _modules() -> list[str]:
    names = ["keras_tfm", *(name for _, name, _ in pkgutil.walk_packages(keras_tfm.__path__, "keras_tfm."))]
    return [name for name in names if any(test.examples for test in FINDER.find(importlib.import_module(name)))]


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", _modules())
def test_every_docstring_example_of_a_module_runs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    module = importlib.import_module(name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    try:
        for test in FINDER.find(module, extraglobs={"np": np, "keras": keras, "keras_tfm": keras_tfm}):
            runner.run(test, out=report.append)
    finally:
        keras.backend.clear_session(free_memory=False)  # layer names free again; a full collection costs ~1 s
    assert runner.failures == 0, "".join(report)
