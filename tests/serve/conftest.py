"""The tiny chat model every server test serves, made once for the package (its decoding compiles once)."""

import pytest

from tests.checks import chat_model


@pytest.fixture(scope="package")
def model():
    return chat_model(max_length=64)
