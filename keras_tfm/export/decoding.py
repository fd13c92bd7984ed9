"""Decoding as traced functions of tensors, so that an exported model decodes without Python Keras.

`decode_tensors` is the whole loop: what a SavedModel's `generate` (a causal LM) or `translate` (a
translator) endpoint (`generate_endpoint`, `translate_endpoint`) runs in TensorFlow's loader or TensorFlow
Serving. The loop is the row loop (`continuous.decode_rows`), as `generate` runs it; every size but the room
for new tokens (`room`, fixed at export) is a traced value: any batch, any prompt length. `cached_step` is one
step over a key/value cache that the caller holds: what a LiteRT or ONNX model exports, whose runtime has no
loop of ours."""

from __future__ import annotations

import keras
from keras import ops

from keras_tfm.export.formats import Endpoint
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.continuous import Loop, decode_rows
from keras_tfm.generation.sampling import RowSettings, config_settings, features_of, sorted_largest, traced_row_seeds


def decode_tensors(
    model,
    token_ids,
    lengths,
    max_new_tokens,
    seed,
    room: int,
    settings: RowSettings,
    stop_token_ids: list[int],
    pad_token_id: int,
    inputs: tuple = (),
) -> dict:
    """The prompts `token_ids` `(rows, width)` (right-padded; row `i`'s first `lengths[i]` tokens)
    continued by up to `min(max_new_tokens, room)` tokens each, chosen with `settings` (NumPy scalars,
    fixed at export; the rows' seeds from `seed`).

    Returns `{"token_ids": (rows, width + room), "lengths": (rows,)}`: each row's prompt, its new
    tokens (up to and with a stop token) and `pad_token_id` after them, and where each row ends.
    `inputs`: the model's own, given to `decoding_cache` (a translator's source ids)."""
    rows = ops.shape(token_ids)[0]
    token_ids, lengths = ops.cast(token_ids, "int32"), ops.cast(lengths, "int32")
    limits = ops.zeros_like(lengths) + ops.clip(ops.cast(max_new_tokens, "int32"), 0, room)
    stops = ops.convert_to_tensor(list(stop_token_ids) or [-1], "int32")
    columns = (ops.zeros((rows,), str(value.dtype)) + ops.convert_to_tensor(value) for value in settings[:-1])
    row_settings = RowSettings(*columns, traced_row_seeds(seed, rows))
    features = features_of(settings)
    loop = Loop(ends=True, largest=sorted_largest)  # a sort: what a SavedModel loader reads
    run = decode_rows(model, features, room, loop)
    generated = run(token_ids, lengths, row_settings, limits, stops, (), *inputs)[0]
    return _written(token_ids, lengths, generated, limits, stops, pad_token_id)


def _written(token_ids, lengths, generated, limits, stops, pad_token_id: int) -> dict:
    """`decode_tensors`' result: each row's prompt, then its `generated` tokens up to and with its first stop
    token (or its `limits` of them), then `pad_token_id`."""
    room = ops.shape(generated)[1]
    stopped = ops.logical_and(
        ops.any(ops.equal(generated[:, :, None], stops[None, None, :]), axis=-1),
        ops.arange(room, dtype="int32")[None, :] < limits[:, None],
    )
    first = ops.cast(ops.argmax(ops.cast(stopped, "int32"), axis=1), "int32") + 1
    counts = ops.where(ops.any(stopped, axis=1), first, limits)
    total = ops.shape(token_ids)[1] + room
    positions = ops.arange(total, dtype="int32")[None, :]
    new = positions - lengths[:, None]  # which new token a position holds
    taken = ops.take_along_axis(generated, ops.clip(new, 0, room - 1), axis=1)
    prompts = ops.pad(token_ids, ((0, 0), (0, room)))
    output = ops.where(new < 0, prompts, ops.where(new < counts[:, None], taken, pad_token_id))
    return {"token_ids": output, "lengths": lengths + counts}


def cached_step(model, token_ids, position, cache) -> dict:
    """The model on `token_ids` `(rows, length)` at positions `position ... position + length - 1` (a
    scalar shared by the rows), reading and writing `cache`: one tensor `(layers, rows, 2,
    key_value_heads, cache_length, head_dim)` that the caller passes back at the next step (zeros
    before the first). Returns `{"logits": (rows, length, vocabulary), "updated_cache": `cache` with this step written}` (an
    output of its own name: tf2onnx would give an input and an output of one name the same tensor).
    A step past the cache's end (`position + length > cache_length`) gives NaN logits: a runtime
    drops graph assertions, and a clamped write would give plausible but wrong ones."""
    layers = tuple(ops.unstack(cache, axis=0))
    position = ops.cast(position, "int32")
    logits, layers = model.call_with_cache(ops.cast(token_ids, "int32"), layers, position)
    fits = ops.cast(position + ops.shape(token_ids)[1] <= ops.shape(cache)[4], logits.dtype)
    logits = logits + ops.divide(
        ops.zeros_like(fits), fits
    )  # 0 / 1 = 0, 0 / 0 = NaN (a `where` came out NaN everywhere through tf2onnx)
    return {"logits": logits, "updated_cache": ops.stack(layers, axis=0)}


# the `GenerationConfig` fields the exported `generate` loop holds (its seed is an input of each call)
EXPORTED_SETTINGS = ("max_new_tokens", "stop_token_ids", "pad_token_id", "temperature", "top_k", "top_p", "min_p")


def generate_endpoint(
    model, config: GenerationConfig, stop_token_ids: list[int], pad_token_id: int, room: int
) -> Endpoint:
    """A causal LM's `generate` endpoint: `decode_tensors` with the export's settings (`config`'s) fixed, up to
    `room` new tokens."""
    settings = config_settings(config)

    def generate(token_ids, lengths, max_new_tokens, seed):  # the names are the signature's
        return decode_tensors(
            model, token_ids, lengths, max_new_tokens, seed, room, settings, stop_token_ids, pad_token_id
        )

    signature = [
        keras.InputSpec(shape=shape, dtype="int32", name=name)
        for name, shape in (("token_ids", (None, None)), ("lengths", (None,)), ("max_new_tokens", ()), ("seed", ()))
    ]
    return Endpoint("generate", generate, signature)


def cached_step_endpoint(model, cache_length: int) -> Endpoint:
    """A built causal LM's `decode` endpoint: `cached_step` over a cache of `cache_length` positions."""
    attention = model.blocks[0].self_attention
    shape = (len(model.blocks), None, 2, attention.num_key_value_heads, cache_length, attention.key_dim)

    def decode(token_ids, position, cache):  # the names are the signature's
        return cached_step(model, token_ids, position, cache)

    signature = [
        keras.InputSpec(shape=(None, None), dtype="int32", name="token_ids"),
        keras.InputSpec(shape=(), dtype="int32", name="position"),
        keras.InputSpec(shape=shape, dtype=model.compute_dtype, name="cache"),
    ]
    cache_shape = ", ".join("batch" if size is None else str(size) for size in shape)
    symbolic = {
        "polymorphic_shapes": ["(batch, length)", "()", f"({cache_shape})"],
        "polymorphic_constraints": [f"length <= {cache_length}"],
        "with_gradient": False,  # an inference step: no gradient to trace (it would lose the constraint)
    }
    return Endpoint("decode", decode, signature, symbolic)


GREEDY = config_settings(GenerationConfig())


def translate_endpoint(model, max_length: int) -> Endpoint:
    """A translator's `translate` endpoint: greedy translations of up to `max_length` tokens."""

    def translate(source_ids):  # the name is the signature's
        rows = ops.shape(source_ids)[0]
        starts = ops.full((rows, 1), model.start_token_id, "int32")
        stops, pad, inputs = [model.end_token_id], model.pad_token_id, (ops.cast(source_ids, "int32"),)
        out = decode_tensors(
            model, starts, ops.ones((rows,), "int32"), max_length, 0, max_length, GREEDY, stops, pad, inputs
        )
        return {"token_ids": out["token_ids"][:, 1:], "lengths": out["lengths"] - 1}

    return Endpoint("translate", translate, [keras.InputSpec(shape=(None, None), dtype="int32", name="source_ids")])
