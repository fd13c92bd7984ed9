"""The exceptions keras_tfm raises for bad input it can name.

Each message says which argument was at fault, what was expected and what came. Library code names Python
arguments (`output_dir`); the command line (`keras_tfm.training.run_main`) shows the same names as flags
(`--output-dir`), so one message serves both. The contract between the two:

- `argument` is the Python argument at fault (or None); the text then begins "argument: ". The command line
  shows it as its flag (`--output-dir: ...`).
- Other arguments a message mentions are written in backticks (`` `data` ``); a front end shows the message
  in its own words with `InputError.words` (the command line each as its flag where it has one, the server
  each as its request field), so no front end rewrites another's text.
- `caller` is the function or class that refused (`from_huggingface`, `ViT`), shown before the message;
  code that passes an error on in its own words reads `message` (and `argument`), never the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MENTIONED = re.compile(r"`([a-z_][a-z0-9_]*)`")  # an argument a message names


class InputError(ValueError):
    """A bad value of one argument, or bad input that no single argument explains.

    Args:
        message: what was expected and what came; other arguments it mentions are written in backticks
            (`` `data` ``), which the command line shows as flags.
        argument: the Python argument at fault, or `None`; the message then reads `"argument: message"`.
        caller: the function or class that refused it, or `None`; shown as `"caller: message"`.
    """

    def __init__(self, message: str, argument: str | None = None, caller: str | None = None):
        text = f"{caller}: {message}" if caller else message
        super().__init__(f"{argument}: {text}" if argument else text)
        self.message = message
        self.argument = argument
        self.caller = caller

    def words(self, shown: Callable[[str], str | None], quoted: bool = True) -> str:
        """The message in a front end's words: each argument it names in backticks as `shown` names it (a
        flag, a request field; None keeps the argument's name), in backticks where `quoted`."""

        def name(mention: re.Match) -> str:
            given = shown(mention[1])
            return mention[0] if given is None else f"`{given}`" if quoted else given

        return MENTIONED.sub(name, self.message)

    def __reduce__(self):  # pickles with its fields (the default would pass the joined text only)
        return type(self), (self.message, self.argument, self.caller)


class DataError(InputError):
    """Data that cannot be read or used: missing files, wrong formats, too little text."""


class CheckpointError(InputError):
    """A checkpoint that cannot be resumed or read: damaged, or written by another model."""
