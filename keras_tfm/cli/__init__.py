"""The commands, run as `python -m keras_tfm COMMAND ...` (`keras_tfm/__main__.py`): each module parses
its flags and calls the library, and only these speak of flags."""
