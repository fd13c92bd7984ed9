"""A decoding call as typed objects: prompts right-padded into one buffer, samples repeated, stop ids
checked; what the orchestration compiles a loop for."""

import numpy as np
import pytest

from keras_tfm.errors import InputError
from keras_tfm.generation import prompts
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.orchestration import finish
from keras_tfm.generation.request import Request, Strategy
from keras_tfm.generation.sampling import Chooser, Features, config_settings

pytestmark = pytest.mark.backend_independent  # NumPy and Python only


def test_ragged_prompts_share_one_buffer_and_each_sample_gets_its_rows():
    strategy, settings = Strategy(num_return_sequences=3), config_settings(GenerationConfig(temperature=0.7))
    request = Request.of_prompts([[5, 6, 7], [8]], None, 10, strategy, max_new_tokens=4, settings=settings,
                                 stop_token_ids=np.array([2]), pad_token_id=0)  # fmt: skip
    assert request.buffer.shape == (6, 7) and request.prompt_width == 3
    np.testing.assert_array_equal(request.lengths, [3, 3, 3, 1, 1, 1])
    np.testing.assert_array_equal(request.buffer[3], [8, 0, 0, 0, 0, 0, 0])
    assert request.prompt_mask[3].tolist() == [True] + [False] * 6
    # sampling values do not retrace (they are the loop's inputs), which warps run does; nor do the prompts'
    # lengths (the loop's room, `orchestration.room`)
    assert request.compiled_key == (strategy, Chooser(Features(sampling=True)), False)

    def key(**sampling) -> tuple:
        return Request.of_prompts([[5, 6, 7], [8]], None, 10, strategy, max_new_tokens=4,
                                  settings=config_settings(GenerationConfig(**sampling)),
                                  stop_token_ids=np.array([2]), pad_token_id=0).compiled_key  # fmt: skip

    assert key(temperature=1.5, top_k=33, top_p=0.8) == key(temperature=0.2, top_k=64, top_p=0.95)
    assert key(temperature=1.5, top_k=33) != key(temperature=1.5, top_k=65)  # another top-k width
    assert key(temperature=1.5) != key(temperature=1.5, min_p=0.1) != key()
    beams = Strategy(num_beams=4, num_return_sequences=2)
    assert beams.search == (4, 1.0, 2) and Strategy().search is None


def test_finish_decodes_each_row_up_to_its_stop_token():
    request = Request.of_prompts(
        [[5, 6], [7]], None, 10, Strategy(), max_new_tokens=3, stop_token_ids=np.array([2]), pad_token_id=0
    )
    output = np.array([[5, 6, 9, 2, 0], [7, 3, 4, 8, 0]])
    texts = finish(request, output, ["a", "b"], lambda ids: ",".join(map(str, ids)))
    assert texts == ["5,6,9,2", "7,3,4,8"]  # up to and with the stop; all 3 new tokens without one
    assert finish(request, output, None, str) is output  # ids stay ids


@pytest.mark.parametrize("stops", [[[1, 2]], 1.5, "3", [1, "3"], [True]])
def test_stop_ids_are_one_id_or_a_flat_list(stops):
    with pytest.raises(InputError, match="`stop_token_ids` must be a token id or a flat list") as info:
        prompts.stop_ids(stops, 10)
    assert info.value.argument == "stop_token_ids"
    np.testing.assert_array_equal(prompts.stop_ids([2, 7], 10), [2, 7])
    assert prompts.stop_ids((), 10).size == 0


def test_the_text_decoder_hands_out_only_text_no_later_token_changes():
    """Bytes as tokens: a character cut mid-way waits for its last byte, a tail that could still become a
    stop string waits, a stop string ends the text (left out), a stop id ends the tokens (kept), and with
    a prefix the text is what decoding prefix and tokens together adds."""
    from keras_tfm.generation import TextDecoder

    def decode(ids):
        return bytes(np.asarray(ids, "uint8").tolist()).decode("utf-8", errors="replace")

    snow = list("☃".encode())  # three bytes
    decoder = TextDecoder(decode, stop_token_ids=[0], stop_strings=("END",))
    assert decoder.feed([ord("a")] + snow[:2]) == ""  # a cut character, and "a" within 2 of the end
    assert decoder.feed(snow[2:] + list(b"xyz")) == "a☃x"  # all but the last len("END") - 1 characters
    assert decoder.feed(list(b"EN")) == "yz" and decoder.finish is None
    assert decoder.feed(list(b"Dqq")) == "" and decoder.finish == "stop" and decoder.text == "a☃xyz"
    ids = TextDecoder(None, stop_token_ids=[0], max_new_tokens=5)
    ids.feed([5, 6]), ids.feed([0, 7])
    assert ids.tokens == [5, 6, 0] and ids.finish == "stop"
    capped = TextDecoder(decode, max_new_tokens=3)
    assert capped.feed(list(b"ab") + snow[:1]) == "ab\ufffd" and capped.finish == "length"  # ended: all of it
    pieces = TextDecoder(decode, prefix=list(b"hi "))
    assert pieces.feed(snow[:1]) == "" and pieces.feed(snow[1:]) == "☃" and pieces.feed([], last=True) == ""
