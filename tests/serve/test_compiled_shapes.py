"""The server's compiled shapes: which compiled chunk serves the rows at hand."""

import pytest

from keras_tfm.generation.sampling import ALL_TOKENS, Features
from keras_tfm.serve.compiled_shapes import CompiledShapes


@pytest.mark.backend_independent
def test_a_chunk_with_more_features_or_a_wider_cut_serves_rows_that_need_fewer():
    shapes = CompiledShapes(None)
    try:
        wide = Features(sampling=True, top_k=64, nucleus=True)
        shapes.ready.add((("chunk", wide, 4), (4, 32)))
        shapes.ready.add((("chunk", wide._replace(top_k=ALL_TOKENS, penalty=True), 4), (4, 32)))
        assert shapes.usable_chunk(Features(sampling=True, top_k=16), 4, (4, 32)) == wide  # the fewest
        assert shapes.usable_chunk(Features(sampling=True, top_k=128), 4, (4, 32)).top_k == ALL_TOKENS
        assert shapes.usable_chunk(Features(sampling=True, top_k=16), 1, (4, 32)) is None  # other steps
        assert shapes.usable_chunk(Features(sampling=True, min_p=True), 4, (4, 32)) is None
    finally:
        shapes.close()
