"""The exceptions keras_tfm raises for bad input it can name.

Each message says which argument was at fault, what was expected and what came. Library code names Python
arguments (`output_dir`); the command line (`keras_tfm.training.run_main`) shows the same names as flags
(`--output-dir`), so one message serves both. The contract between the two:

- `argument` is the Python argument at fault (or None); the text then begins "argument: ". The command line
  shows it as its flag (`--output-dir: ...`).
- Other arguments a message mentions are written in backticks (`` `data` ``); the command line turns each
  into its flag where it has one, and leaves the rest as written.
- `caller` is the function or class that refused (`from_huggingface`, `ViT`), shown before the message;
  code that passes an error on in its own words reads `message` (and `argument`), never the text.
"""

from __future__ import annotations


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

    def __reduce__(self):  # pickles with its fields (the default would pass the joined text only)
        return type(self), (self.message, self.argument, self.caller)


class DataError(InputError):
    """Data that cannot be read or used: missing files, wrong formats, too little text."""


class CheckpointError(InputError):
    """A checkpoint that cannot be resumed or read: damaged, or written by another model."""
