"""Decoding as one traced function of tensors: what an exported SavedModel's `generate` (a causal LM)
or `translate` (a translator) endpoint runs, so that TensorFlow's loader or TensorFlow Serving decodes
without Python Keras. The loop is `decoding.decode`, as `generate` runs it; here every size but the
room for new tokens (`room`, fixed at export) is a traced value: any batch, any prompt length."""

from __future__ import annotations

from keras import ops

from keras_tfm.generation.decoding import Batch, Decoder, _seed_vessel, decode
from keras_tfm.generation.sampling import Sampler


class SortingSampler(Sampler):
    """A `Sampler` whose top-k threshold comes from a sort: JAX serializes `top_k` as a StableHLO
    composite that TensorFlow 2.21's SavedModel loader cannot read, and a sort it can."""

    def kth_largest(self, logits):
        return ops.sort(logits, axis=-1)[:, -self.top_k :][:, :1]


def decode_tensors(
    model,
    token_ids,
    lengths,
    max_new_tokens,
    seed,
    room: int,
    sampler: Sampler,
    stop_token_ids: list[int],
    pad_token_id: int,
    inputs: tuple = (),
) -> dict:
    """The prompts `token_ids` `(rows, width)` (right-padded; row `i`'s first `lengths[i]` tokens)
    continued by up to `min(max_new_tokens, room)` tokens each, drawn by `sampler` from `seed`.

    Returns `{"token_ids": (rows, width + room), "lengths": (rows,)}`: each row's prompt, its new
    tokens (up to and with a stop token) and `pad_token_id` after them, and where each row ends.
    `inputs`: the model's own, given to `decoding_cache` (a translator's source ids)."""
    rows, width = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    token_ids = ops.cast(token_ids, "int32")
    lengths = ops.cast(lengths, "int32")
    buffer = ops.concatenate([token_ids, ops.full((rows, room), pad_token_id, "int32")], axis=1)
    total = ops.shape(buffer)[1]
    positions = ops.arange(total, dtype="int32")[None, :]
    max_new_tokens = ops.clip(ops.cast(max_new_tokens, "int32"), 0, room)
    stops = ops.convert_to_tensor(list(stop_token_ids) or [-1], "int32")
    batch = Batch(
        buffer,
        positions < lengths[:, None],
        lengths,
        max_new_tokens,
        stops,
        ops.convert_to_tensor(pad_token_id, "int32"),
    )
    cache, context = model.decoding_cache(rows, total, *inputs)
    seed_state = ops.cast(ops.stack([ops.cast(seed, "int32"), 0]), _seed_vessel().state.dtype)
    decoder = Decoder(model.call_with_cache, vocabulary_size=model.decoding_vocabulary_size)
    output, _ = decode(decoder, batch._replace(context=context), width, cache, seed_state, sampler)
    return {"token_ids": output, "lengths": _ends(output, lengths, max_new_tokens, stops)}


def _ends(output, lengths, max_new_tokens, stops):
    """Where each row of `output` ends: after its first new stop token, or after all its new tokens."""
    positions = ops.arange(ops.shape(output)[1], dtype="int32")[None, :]
    new = ops.logical_and(positions >= lengths[:, None], positions < (lengths + max_new_tokens)[:, None])
    stopped = ops.logical_and(new, ops.any(ops.equal(output[:, :, None], stops[None, None, :]), axis=-1))
    first = ops.cast(ops.argmax(ops.cast(stopped, "int32"), axis=1), "int32") + 1
    return ops.where(ops.any(stopped, axis=1), first, lengths + max_new_tokens)
