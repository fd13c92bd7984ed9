"""`python -m keras_tfm generate CHECKPOINT --chat`: a conversation in the terminal.

Each line read is a user's turn; the reply streams back and joins the conversation, which the
checkpoint's chat template renders whole at every turn. Ctrl-C ends the reply being written (what was
written stays in the conversation) or clears the line being typed; Ctrl-D (end of input) leaves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import numpy as np

from keras_tfm.cli.interrupt import pieces_until_ctrl_c
from keras_tfm.errors import InputError
from keras_tfm.generation import orchestration


def reply_pieces(model, messages: list[dict], stream_arguments: dict) -> Iterator[str]:
    """The model's reply to `messages` as text pieces, as it is made; it ends at the checkpoint's end ids."""
    text = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    prompt = np.asarray(model.tokenizer.encode(text)).tolist()  # the template holds the special tokens
    # up to and with an end id, which the tokenizer decodes to nothing
    yield from orchestration.text_pieces(model.stream(prompt, **stream_arguments), model.tokenizer.decode_text)


def conversation(
    model,
    system: str | None,
    stream_arguments: dict,
    read: Callable[[str], str] = input,
    write: Callable[[str], object] = sys.stdout.write,
) -> list[dict]:
    """Holds a conversation until the end of input; returns its messages."""
    if model.tokenizer is None or not model.tokenizer.chat_template:
        raise InputError("needs a checkpoint whose tokenizer has a chat template.", "chat")
    messages = [{"role": "system", "content": system}] if system else []
    while True:
        try:
            line = read("> ")
        except EOFError:  # Ctrl-D
            write("\n")
            return messages
        except KeyboardInterrupt:  # Ctrl-C while typing: a fresh line
            write("\n")
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = ""
        try:
            for piece in pieces_until_ctrl_c(reply_pieces(model, messages, stream_arguments)):
                reply += piece
                write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:  # Ctrl-C while it writes: this reply ends here
            write(" [stopped]")
        write("\n")
        messages.append({"role": "assistant", "content": reply})
