"""The exceptions keras_tfm raises for bad input it can name.

Each message says which argument was at fault, what was expected and what came. Library code names Python
arguments (`output_dir`); the command line (`keras_tfm.training.run_main`) shows the same names as flags
(`--output-dir`), so one message serves both.
"""

from __future__ import annotations


class InputError(ValueError):
    """A bad value of one argument, or bad input that no single argument explains.

    Args:
        message: what was expected and what came; other arguments it mentions are written in backticks
            (`` `data` ``), which the command line shows as flags.
        argument: the Python argument at fault, or `None`; the message then reads `"argument: message"`.
    """

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(f"{argument}: {message}" if argument else message)
        self.message = message
        self.argument = argument

    def __reduce__(self):  # pickles with its argument (the default would pass the joined text only)
        return type(self), (self.message, self.argument)


class DataError(InputError):
    """Data that cannot be read or used: missing files, wrong formats, too little text."""


class CheckpointError(InputError):
    """A checkpoint that cannot be resumed or read: damaged, or written by another model."""
