"""The one orchestration of generation: a `Request` decoded by a model, compiled once per setting.

`generate`, `stream`, `chat` and `translate` are adapters: each makes a `Request` and calls `run` (the
whole loop at once) or `stream` (a chunk at a time), then `finish` (text, scores, continuations per
prompt). A model that generates is a `protocol.DecodingModel`. The compiled functions are kept on the
model (`compiled_decoding()`): each loop is compiled once per setting and reused, with XLA on JAX and
TensorFlow, recorded once with `torch.jit.trace` and replayed on PyTorch (`compiled`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
from keras import ops

from keras_tfm.generation import compiled
from keras_tfm.generation.beam_search import beam_decode
from keras_tfm.generation.decoding import Decoder, decode, decode_until, prefill
from keras_tfm.generation.request import Request
from keras_tfm.generation.text import TextDecoder


def _decoder(model, request: Request) -> Decoder:
    step, while_loop = compiled.decoding_functions(model.call_with_cache, model)
    return Decoder(step, while_loop, request.chooser, model.decoding_vocabulary_size)


def run(model, request: Request, inputs: tuple = ()) -> tuple[np.ndarray, np.ndarray | None]:
    """The request decoded to the end: the output buffer `(rows, total)` (the best beams, `rows *
    num_return_sequences`, for beam search) and, with `return_scores`, each new token's
    log-probability from its row's prompt end on, `(rows, max_new_tokens)`; `inputs`: the model's own
    (a translator's source ids)."""
    key, functions = ("run", *request.compiled_key), model.compiled_decoding()  # built before a trace
    if key not in functions:
        decoder, width = _decoder(model, request), request.prompt_width
        strategy, with_scores = request.strategy, request.return_scores

        def loop(batch, *inputs):
            copies = strategy.num_beams
            cache, context = model.decoding_cache(
                batch.buffer.shape[0] * copies, batch.buffer.shape[1], *inputs, copies=copies
            )
            batch = batch._replace(context=context)
            if strategy.search is not None:
                return beam_decode(decoder, batch, width, cache, strategy.search)
            return decode(decoder, batch, width, cache, with_scores)

        functions[key] = compiled.compile_function(loop, model)
    output = functions[key](request.batch(), *inputs)
    if not request.return_scores:
        return ops.convert_to_numpy(output), None
    output, every = (ops.convert_to_numpy(part) for part in output)
    lengths = request.lengths.tolist()
    return output, np.stack([every[i, n : n + request.max_new_tokens] for i, n in enumerate(lengths)])


def stream(model, request: Request, chunk_size: int) -> Iterator[tuple[np.ndarray, int, bool]]:
    """Decodes the request's one row `chunk_size` positions at a time, keeping the cache between
    chunks; yields `(row, written, finished)`: the row so far and how many of its positions are written."""
    key, functions = ("stream", *request.compiled_key), model.compiled_decoding()
    if key not in functions:
        decoder, width = _decoder(model, request), request.prompt_width

        def start(batch):
            cache, context = model.decoding_cache(batch.buffer.shape[0], batch.buffer.shape[1])
            return prefill(decoder, batch._replace(context=context), width, cache)

        def advance(state, batch, until):
            return decode_until(decoder, state, batch, until)

        functions[key] = (compiled.compile_function(start, model), compiled.compile_function(advance, model))
    start, advance = functions[key]
    batch = request.batch()
    state = start(batch)
    total = request.buffer.shape[1]
    while True:
        position = int(ops.convert_to_numpy(state.t))
        state = advance(state, batch, ops.convert_to_tensor(min(position + chunk_size, total), "int32"))
        position = int(ops.convert_to_numpy(state.t))
        finished = bool(np.all(ops.convert_to_numpy(state.done))) or position >= total
        yield ops.convert_to_numpy(state.buffer)[0], position, finished
        if finished:
            return


def finish(request: Request, output: np.ndarray, texts, decode_text: Callable[[np.ndarray], str], counts=None):
    """`output` as `generate` returns it: the ids as they are for id prompts; for text, each row's
    prompt and new tokens (up to and with a stop token, or its `counts` of them) as text: a string for
    a string, a list for a list (of `num_return_sequences` strings each, where more than one)."""
    if texts is None:
        return output
    count = request.strategy.num_return_sequences
    lengths = np.repeat(request.lengths, count) if request.strategy.search is not None else request.lengths
    decoded = []
    counts = [request.max_new_tokens] * len(output) if counts is None else counts
    for row, length, new in zip(output, lengths, counts):
        ends = TextDecoder(None, request.stop_token_ids, max_new_tokens=int(new))
        ends.feed(row[length:], last=True)
        decoded.append(decode_text(row[: length + len(ends.tokens)]))
    if count > 1:
        decoded = [decoded[i : i + count] for i in range(0, len(decoded), count)]
    return decoded[0] if isinstance(texts, str) else decoded


def stream_pieces(model, request: Request, chunk_size: int, text: bool, decode_text: Callable[[np.ndarray], str]):
    """The stream of one request as `CausalLM.stream` yields it: arrays of new ids, or text pieces
    whose concatenation is what `generate` adds to the prompt's text (a `TextDecoder`'s)."""
    prompt_length = int(request.lengths[0])
    decoder = TextDecoder(
        decode_text if text else None,
        request.stop_token_ids,
        max_new_tokens=request.max_new_tokens,
        prefix=request.buffer[0, :prompt_length],
    )
    written = prompt_length
    for row, position, finished in stream(model, request, chunk_size):
        taken = len(decoder.tokens)
        piece = decoder.feed(row[written:position], last=finished)
        written = position
        if not text and len(decoder.tokens) > taken:
            yield np.asarray(decoder.tokens[taken:], row.dtype)
        elif piece:
            yield piece


def text_pieces(id_pieces: Iterator[np.ndarray], decode_text: Callable[[np.ndarray], str], prefix=()):
    """Arrays of new ids as the text each adds to `prefix` (ids already written), by a `TextDecoder`."""
    decoder = TextDecoder(decode_text, prefix=prefix)
    for piece in id_pieces:
        if text := decoder.feed(piece):
            yield text
    if rest := decoder.feed([], last=True):
        yield rest
