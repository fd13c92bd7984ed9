"""The one exception the data and runtime layers raise for bad input: recipes print it, no traceback."""


class DataError(ValueError):
    """Bad or missing data; the message names the flag, what was expected and what came."""
