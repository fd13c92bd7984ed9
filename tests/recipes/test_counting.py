"""The counting recipe: a question about a generated picture answered by question tokens that attend to its patch
tokens; a short run leaves its accuracy beside the question-only answer's, and the attention maps (learning:
the recipe's recorded run, benchmarks/results/recipes.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.recipes.helpers import recipe, recipe_function


@pytest.mark.backend_independent
def test_counting_recipe_answers_beside_the_question_only_answer_and_draws_attention(tmp_path):
    out = tmp_path / "run"
    done = recipe("counting.py", "--epochs", "1", "--train-images", "128", "--test-images", "32", "--batch-size", "32",
                  "--num-layers", "1", "--image-layers", "1", "--hidden-dim", "32", "--output-dir", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["validation_accuracy"] <= 1 and 0 < metrics["question_only_accuracy"] < 1
    assert (out / "attention_maps.png").read_bytes()[:4] == b"\x89PNG"
    assert f"seeing only the question: {metrics['question_only_accuracy']:.4f}" in done.stdout


@pytest.mark.backend_independent
def test_the_question_only_answer_is_each_kinds_most_frequent_training_answer():
    questions, accuracy = recipe_function("counting.py", "questions"), recipe_function("counting.py",
                                                                                         "question_only_accuracy")  # fmt: skip
    from keras_tfm.data import make_shapes

    train, test = (questions(make_shapes(n, 32, 4, min_shapes=0, seed=s), s) for n, s in ((400, 0), (100, 1)))
    kinds_words = {2: 0, 3: 1, 4: 2}
    assert all(kinds_words[row[2]] == kind for row, kind in zip(train["question"], train["kind"]))
    best = {
        kind: max(range(5), key=lambda a: np.sum((train["kind"] == kind) & (train["answer"] == a))) for kind in range(3)
    }
    expected = np.mean([best[kind] == answer for kind, answer in zip(test["kind"], test["answer"])])
    assert accuracy(train, test) == pytest.approx(expected) and 0.3 < expected < 0.9
