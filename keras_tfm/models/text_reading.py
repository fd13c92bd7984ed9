"""Reading text with a token classifier or a question answerer: each word of a text labelled (named entities,
parts of speech), and the span of a context that answers a question, as transformers' pipelines find them."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_integer

IGNORED_LABEL = -100  # transformers' label for the tokens a loss skips (a word's later pieces, padding)
AGGREGATIONS = ("first", "average", "max")  # how `label_words` labels a word from its pieces


class LabelsWords:
    """`label_words` for a token classifier with `class_names` and an encoder with `longest_input`."""

    def label_words(self, texts, aggregation: str = "first", stride: int | None = None) -> list:
        """Each text's words with a label each, as transformers' token-classification pipeline labels words
        (its `aggregation_strategy`, before it groups them into entities): per text a list of `{"word",
        "label", "score", "start", "end"}`, `start` and `end` the word's characters in the text. Needs the
        checkpoint's tokenizer.

        `aggregation`: how a word's pieces give its label: "first" (its first piece's), "average" (the
        mean of its pieces' probabilities) or "max" (its most confident piece's). A text longer than the
        model reads is read in windows that share `stride` tokens (default: a quarter of the model's length);
        each word is labelled in the window where it stands farthest from an edge, so every word gets one."""
        if aggregation not in AGGREGATIONS:
            raise InputError(f"expected one of {', '.join(AGGREGATIONS)}; received {aggregation!r}.",
                             "aggregation", caller="label_words")  # fmt: skip
        length = self.encoder.longest_input
        stride = length // 4 if stride is None else stride
        if not is_integer(stride) or not 0 <= stride < length // 2:
            raise InputError(f"expected an integer in [0, {length // 2}) (half the model's {length} tokens); "
                             f"received {stride!r}.", "stride", caller="label_words")  # fmt: skip
        single = isinstance(texts, str)
        texts = [texts] if single else texts
        _check_texts(texts, "label_words")
        tokenizer = _tokenizer_with(self, "encode_windows", "label_words")
        labelled = [_words(self, tokenizer.encode_windows(text, length, stride), text, aggregation) for text in texts]
        return labelled[0] if single else labelled


def _check_texts(texts, caller: str) -> None:
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise InputError("expected a text or a non-empty list of texts.", "texts", caller=caller)


def _tokenizer_with(model, method: str, caller: str):
    """The model's tokenizer, where it has `method` (the offsets and pairs of `tokenizers`' encodings)."""
    if model.tokenizer is None or not hasattr(model.tokenizer, method):
        raise InputError("this model has no tokenizer that gives each token's characters (a checkpoint's "
                         "tokenizer.json or vocab.txt): set `model.tokenizer`.", "tokenizer",
                         caller=caller)  # fmt: skip
    return model.tokenizer


def _softmax(logits: np.ndarray) -> np.ndarray:
    exponentials = np.exp(logits - logits.max(-1, keepdims=True))
    return exponentials / exponentials.sum(-1, keepdims=True)


def _words(model, windows: list, text: str, aggregation: str) -> list[dict]:
    """The words of `text`, each labelled from the window (of `windows`) where it stands farthest from an edge."""
    chosen = {}  # word -> (its distance from the window's edges, its pieces' probabilities, its characters)
    for window in windows:
        logits = ops.convert_to_numpy(model.predict_on_batch({"token_ids": np.asarray(window.ids, "int32")[None]}))
        probabilities = _softmax(logits[0])
        pieces: dict[int, list[int]] = {}  # each word's token positions, in order
        for position, word in enumerate(window.word_ids):
            if word is not None:
                pieces.setdefault(word, []).append(position)
        for word, positions in pieces.items():
            margin = min(positions[0], len(window.ids) - 1 - positions[-1])
            if word not in chosen or margin > chosen[word][0]:
                chosen[word] = (margin, probabilities[positions], window.word_to_chars(word))
    words = []
    for word in sorted(chosen):
        _, pieces_probabilities, (start, end) = chosen[word]
        if aggregation == "average":
            probabilities = pieces_probabilities.mean(0)
        else:  # the first piece's, or the most confident piece's
            probabilities = pieces_probabilities[
                0 if aggregation == "first" else int(pieces_probabilities.max(-1).argmax())
            ]
        label = int(probabilities.argmax())
        words.append({"word": text[start:end], "label": model.class_names[label],
                      "score": float(probabilities[label]), "start": start, "end": end})  # fmt: skip
    return words


class AnswersQuestions:
    """`answer` for a model whose `(batch, 2, length)` logits mark an answer's start and end."""

    def answer(self, question: str, context: str, max_answer_length: int = 15, max_length: int = 384,
               stride: int = 128) -> dict:  # fmt: skip
        """The likeliest span of `context` that answers `question`, as transformers' question-answering
        pipeline finds it: `{"answer", "score", "start", "end"}`, `start` and `end` its characters in the
        context, `score` the start's probability times the end's. A context longer than `max_length` tokens
        is read in windows that share `stride` tokens; spans of at most `max_answer_length` tokens."""
        if not all(isinstance(text, str) and text.strip() for text in (question, context)):
            raise InputError("expected a question and a context, each a non-empty string.", "question", caller="answer")
        for name, value, low in (("max_answer_length", max_answer_length, 1), ("max_length", max_length, 8),
                                 ("stride", stride, 0)):  # fmt: skip
            if not is_integer(value) or value < low:
                raise InputError(f"expected an integer >= {low}; received {value!r:.80}.", name, caller="answer")
        tokenizer = _tokenizer_with(self, "encode_pair_windows", "answer")
        length = min(max_length, self.encoder.longest_input)
        windows = tokenizer.encode_pair_windows(question, context, length, min(stride, length // 2))
        best = {"answer": "", "score": 0.0, "start": 0, "end": 0}
        for window in windows:
            inputs = {"token_ids": np.asarray([window.ids], "int32")}
            if getattr(self.encoder, "num_segments", 0):  # the context as sentence B
                inputs["segment_ids"] = np.asarray([window.type_ids], "int32")
            logits = ops.convert_to_numpy(self.predict_on_batch(inputs))[0]
            found = _best_span(logits, np.asarray([part == 1 for part in window.sequence_ids]), max_answer_length)
            if found is not None and found[2] > best["score"]:
                start, end = window.offsets[found[0]][0], window.offsets[found[1]][1]
                best = {"answer": context[start:end], "score": found[2], "start": start, "end": end}
        return best


def _best_span(logits: np.ndarray, in_context: np.ndarray, max_answer_length: int) -> tuple | None:
    """(start, end, score) of the likeliest span of context tokens: each logit outside the context and [CLS]
    at -10000 before the softmax, [CLS]'s probability then zeroed (no empty answer), as transformers does."""
    if not in_context.any():
        return None
    masked = np.where(in_context | (np.arange(len(in_context)) == 0), logits, -10000.0)  # [CLS] in the softmax
    probabilities = _softmax(masked)
    probabilities[:, 0] = 0.0
    scores = np.tril(np.triu(np.outer(probabilities[0], probabilities[1])), max_answer_length - 1)
    scores[~in_context] = 0.0
    scores[:, ~in_context] = 0.0
    start, end = np.unravel_index(int(scores.argmax()), scores.shape)
    return int(start), int(end), float(scores[start, end])
