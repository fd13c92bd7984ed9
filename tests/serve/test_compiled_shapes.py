"""The server's compiled shapes: which compiled chunk serves the rows at hand."""

import threading

import pytest

from keras_tfm.generation import compiled
from keras_tfm.generation.sampling import Features
from keras_tfm.serve.compiled_shapes import CompiledShapes, prefill_length, warm_up_plan


@pytest.mark.backend_independent
def test_a_chunk_with_more_features_or_a_wider_cut_serves_rows_that_need_fewer():
    shapes = CompiledShapes(None)
    try:
        wide = Features(sampling=True, top_k=64, nucleus=True)
        shapes.ready.add((("chunk", wide, 4), (4, 32)))
        shapes.ready.add((("chunk", wide._replace(top_k=256, uncut=True, penalty=True), 4), (4, 32)))
        assert shapes.usable_chunk(Features(sampling=True, top_k=16), 4, (4, 32)) == wide  # the fewest
        assert shapes.usable_chunk(Features(sampling=True, top_k=128), 4, (4, 32)).top_k == 256
        assert shapes.usable_chunk(Features(sampling=True, top_k=16, uncut=True), 4, (4, 32)).uncut
        assert shapes.usable_chunk(Features(sampling=True, top_k=16), 1, (4, 32)) is None  # other steps
        assert shapes.usable_chunk(Features(sampling=True, min_p=True), 4, (4, 32)) is None
    finally:
        shapes.close()


@pytest.mark.backend_independent
def test_rows_whose_shape_is_not_compiled_use_the_smallest_compiled_shape_that_holds_them():
    """And prompts whose prefill is not compiled, the narrowest compiled prefill the cache holds."""
    shapes = CompiledShapes(None)
    try:
        greedy, sampling = Features(), Features(sampling=True)
        shapes.ready |= {(("chunk", sampling, 4), (1, 128)), (("chunk", sampling, 4), (4, 64))}
        shapes.ready |= {(("chunk", greedy, 4), (16, 32)), (("prefill",), (1, 256))}
        assert shapes.holding(greedy, 4, (1, 32)) == (1, 128)  # fewest rows first
        assert shapes.holding(sampling, 4, (2, 32)) == (4, 64)
        assert shapes.holding(sampling, 4, (8, 32)) is None  # the 16 rows compute no sampling
        assert shapes.holding(greedy, 4, (1, 256)) is None  # a prefill is no chunk
        assert shapes.holding(greedy, 1, (1, 32)) is None
        shapes.ready |= {(("prefill",), (1, 64)), (("prefill",), (4, 32))}
        assert shapes.prefill_width(1, 32, 128) == 64 and shapes.prefill_width(1, 32, 32) == 32  # none fits
        assert shapes.prefill_width(4, 32, 128) == 32 and shapes.prefill_width(1, 128, 256) == 256
    finally:
        shapes.close()


@pytest.mark.backend_independent
def test_the_warm_up_makes_one_row_ready_for_every_length_and_setting_before_the_rest():
    """Before ready: the longest prefill, chunk and write of one row, and its first token's choice; beside,
    every other shape."""

    class Model:
        max_length = 512

    greedy, sampling = Features(), Features(sampling=True, top_k=32)
    first, beside = warm_up_plan(Model(), 16, 100, [greedy, sampling, greedy, Features(penalty=True)], 4)
    merged = Features(sampling=True, top_k=32, penalty=True)
    assert first == [(("prefill",), (1, 128)), (("chunk", merged, 4), (1, 128)), (("admit", (1, 128)), (1, 128)),
                     (("first", merged), (1, 0))]  # fmt: skip
    # one chunk a shape where a chunk of greedy rows skips the sampling (JAX, TensorFlow), else one a kind
    kinds = {merged} if compiled.takes_branches() else {greedy, sampling, Features(penalty=True)}
    chunks = [item for item in first + beside if item[0][0] == "chunk"]
    assert len(chunks) == 3 * 3 * len(kinds) + (merged not in kinds)
    assert {key[1] for key, _ in chunks} == kinds | {merged}
    assert len(set(beside)) == len(beside) and not set(first) & set(beside)
    shapes = [(rows, size) for size in (32, 64, 128) for rows in (1, 4, 16)]
    assert {shape for _, shape in chunks} == set(shapes)
    assert (("prefill",), (1, 32)) in beside and (("admit", (1, 32)), (16, 64)) in beside
    # first beside: the prefills of a prompt alone between the cache lengths, for its first token; their
    # caches are the cache lengths', so they add no writes
    assert beside[:5] == [(("prefill",), (1, width)) for width in (16, 24, 40, 48, 56)]
    assert {key[1] for key, _ in beside if key[0] == "admit"} == set(shapes)
    firsts = {item for item in beside if item[0][0] == "first"}
    assert firsts == {(("first", merged), (rows, 0)) for rows in (4, 16)}


@pytest.mark.backend_independent
def test_a_prompt_alone_is_prefilled_at_the_next_multiple_of_8_up_to_64_tokens():
    assert prefill_length(10, 512, 1) == 16 and prefill_length(16, 512, 1) == 16
    assert prefill_length(17, 512, 1) == 24 and prefill_length(34, 512, 1) == 40 and prefill_length(64, 512, 1) == 64
    assert prefill_length(65, 512, 1) == 128 and prefill_length(10, 512, 2) == 32  # prompts together: a cache's
    assert prefill_length(10, 12, 1) == 12 and prefill_length(40, 32, 1) == 32  # never past the context


@pytest.mark.backend_independent
def test_the_shapes_compiling_beside_are_counted_until_each_is_done():
    shapes = CompiledShapes(None)
    release = threading.Event()
    shapes.compile = lambda key, shape: release.wait(10)
    try:
        shapes.compile_later([(("prefill",), (1, 32)), (("prefill",), (1, 64))], None)
        assert shapes.compiling() == 2
        release.set()
        shapes._pool.submit(lambda: None).result(10)  # the pool's one thread has run both
        assert shapes.compiling() == 0
    finally:
        shapes.close()


@pytest.mark.backend_independent
def test_nothing_compiles_once_closed_and_asking_raises_nothing():
    """An engine closed just as its warm-up ends asks for the rest after `close`: nothing starts."""
    shapes = CompiledShapes(None)
    started = []
    shapes.compile = lambda key, shape: started.append(shape)
    shapes.close()
    shapes.compile_later([(("prefill",), (1, 32))], None)
    assert not shapes.available([(("prefill",), (1, 64))])
    assert shapes.compiling() == 0 and not started
