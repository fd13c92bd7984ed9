"""The one incremental text decoder: new token ids in, the text that no later token can change out.

`stream`, `chat`, the chat command and the server feed it each chunk of new ids. It ends a continuation
at a stop id (kept), after `max_new_tokens`, or before a stop string (left out), and holds back what a
later token could still change: a character cut mid-way (a trailing U+FFFD) and the tail that could
still grow into a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

REPLACEMENT = "\ufffd"  # what a tokenizer decodes a character cut mid-way to


class TextDecoder:
    """Decodes one continuation as it is made.

    Args:
        decode_text: ids -> text (the tokenizer's, without special tokens); None: ids only.
        stop_token_ids: a continuation ends after one of these (kept in `tokens`).
        stop_strings: a continuation ends before the first of these (left out of `text`).
        max_new_tokens: a continuation ends after this many tokens (None: no limit).
        prefix: ids written before the continuation (a prompt): the text is what decoding the prefix and
            the new ids together adds to the prefix's text, as `generate` returns it; () decodes the new
            ids alone, as the server answers.
        incremental: False decodes the text only once the continuation ends (`feed` then hands out
            nothing before): for a caller that reads the text at the end alone.

    Example:
    >>> decoder = TextDecoder(lambda ids: "".join(chr(97 + i) for i in ids), stop_strings=("cd",))
    >>> decoder.feed([0, 1, 2]), decoder.feed([3, 4]), decoder.finish
    ('ab', '', 'stop')
    """

    def __init__(
        self,
        decode_text: Callable[[np.ndarray], str] | None,
        stop_token_ids: Iterable[int] = (),
        stop_strings: tuple[str, ...] = (),
        max_new_tokens: int | None = None,
        prefix: Iterable[int] = (),
        incremental: bool = True,
    ):
        self.incremental = incremental
        self.decode_text, self.stop_strings, self.max_new_tokens = decode_text, tuple(stop_strings), max_new_tokens
        self.stop_token_ids = {int(i) for i in np.asarray(list(stop_token_ids)).reshape(-1)}
        self.prefix = [int(i) for i in prefix]
        self.prefix_text = decode_text(np.asarray(self.prefix, "int32")) if decode_text and self.prefix else ""
        self.tokens: list[int] = []  # the new ids, up to and with a stop id
        self.finish: str | None = None  # "stop" or "length" once ended
        self.text = ""  # the new text, cut before a stop string
        self.sent = ""  # what `feed` has handed out

    def feed(self, ids, last: bool = False) -> str:
        """Takes new ids (those after the end are dropped); returns the text they make safe to show: all of
        it once the continuation ended or with `last`, else all but what a later id could change."""
        for token in np.asarray(ids).reshape(-1).tolist():
            if self.finish is not None:
                break
            self.tokens.append(int(token))
            if token in self.stop_token_ids:
                self.finish = "stop"
            elif self.max_new_tokens is not None and len(self.tokens) >= self.max_new_tokens:
                self.finish = "length"
        done = last or self.finish is not None
        if self.decode_text is None or not (done or self.incremental):
            return ""
        self.text = self._new_text()
        done = done or self.finish is not None  # a stop string ends it too
        safe = self.text if done else self.text.rstrip(REPLACEMENT)
        if not done and self.stop_strings:  # the tail that could still become a stop string
            safe = safe[: max(len(self.text) - max(map(len, self.stop_strings)) + 1, 0)]
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent) :], safe
        return piece

    def _new_text(self) -> str:
        full = self.decode_text(np.asarray(self.prefix + self.tokens, "int32"))
        text = full[len(self.prefix_text) :] if full.startswith(self.prefix_text) else self.sent
        cuts = [index for index in (text.find(stop) for stop in self.stop_strings) if index >= 0]
        if cuts:
            self.finish = "stop"
            return text[: min(cuts)]
        return text
