"""A decoding call as typed objects: prompts right-padded into one buffer, samples repeated, stop ids
checked; what the orchestration compiles a loop for."""

import numpy as np
import pytest

from keras_tfm.errors import InputError
from keras_tfm.generation import prompts
from keras_tfm.generation.orchestration import finish, generated_end
from keras_tfm.generation.request import Request, Strategy
from keras_tfm.generation.sampling import Sampler

pytestmark = pytest.mark.backend_independent  # NumPy and Python only


def test_ragged_prompts_share_one_buffer_and_each_sample_gets_its_rows():
    strategy = Strategy(Sampler(temperature=0.7), num_return_sequences=3)
    request = Request.of_prompts(
        [[5, 6, 7], [8]], None, 10, strategy, max_new_tokens=4, stop_token_ids=np.array([2]), pad_token_id=0
    )
    assert request.buffer.shape == (6, 7) and request.prompt_width == 3
    np.testing.assert_array_equal(request.lengths, [3, 3, 3, 1, 1, 1])
    np.testing.assert_array_equal(request.buffer[3], [8, 0, 0, 0, 0, 0, 0])
    assert request.prompt_mask[3].tolist() == [True] + [False] * 6
    assert request.compiled_key == (strategy, 3, request.controls, False)  # prompts' lengths retrace, not values
    beams = Strategy(num_beams=4, num_return_sequences=2)
    assert beams.search == (4, 1.0, 2) and beams.traceable and Strategy().search is None


def test_finish_decodes_each_row_up_to_its_stop_token():
    request = Request.of_prompts(
        [[5, 6], [7]], None, 10, Strategy(), max_new_tokens=3, stop_token_ids=np.array([2]), pad_token_id=0
    )
    output = np.array([[5, 6, 9, 2, 0], [7, 3, 4, 8, 0]])
    assert generated_end(output[0], 2, 3, request.stop_token_ids) == 4
    assert generated_end(output[1], 1, 3, request.stop_token_ids) == 4  # all new tokens, no stop
    texts = finish(request, output, ["a", "b"], lambda ids: ",".join(map(str, ids)))
    assert texts == ["5,6,9,2", "7,3,4,8"]
    assert finish(request, output, None, str) is output  # ids stay ids


@pytest.mark.parametrize("stops", [[[1, 2]], 1.5, "3", [1, "3"], [True]])
def test_stop_ids_are_one_id_or_a_flat_list(stops):
    with pytest.raises(InputError, match="stop_token_ids: expected a token id or a flat list") as info:
        prompts.stop_ids(stops, 10)
    assert info.value.argument == "stop_token_ids"
    np.testing.assert_array_equal(prompts.stop_ids([2, 7], 10), [2, 7])
    assert prompts.stop_ids((), 10).size == 0
