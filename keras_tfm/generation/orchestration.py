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

from keras_tfm.generation import compiled, continuous
from keras_tfm.generation.beam_search import Decoder, beam_decode
from keras_tfm.generation.continuous import Loop, Rows
from keras_tfm.generation.request import Request
from keras_tfm.generation.rows import RowState
from keras_tfm.generation.sampling import RowSettings, bias_of, row_seeds
from keras_tfm.generation.text import TextDecoder


def run(model, request: Request, inputs: tuple = ()) -> tuple[np.ndarray, np.ndarray | None]:
    """The request decoded to the end: the output buffer `(rows, total)` (the best beams, `rows *
    num_return_sequences`, for beam search) and, with `return_scores`, each new token's
    log-probability from its row's prompt end on, `(rows, max_new_tokens)`, 0 after the row's end; `inputs`: the
    model's own (a translator's source ids). Greedy decoding and sampling run the row loop
    (`continuous.decode_rows`), beam search its own."""
    if request.strategy.search is not None:
        return _beams(model, request, inputs), None
    features, loop = request.chooser.features, _loop(request)
    width, steps = room(request.prompt_width, request.max_new_tokens, model.max_length)
    key, functions = ("rows", features, steps, loop), model.compiled_decoding()
    if key not in functions:
        functions[key] = compiled.compile_function(continuous.decode_rows(model, features, steps, loop), model)
    outputs = functions[key](*_loop_inputs(request, width, features.biased), *inputs)
    new = request.max_new_tokens
    generated = ops.convert_to_numpy(outputs[0])[:, :new]
    counts = [_count(tokens, request.stop_token_ids) for tokens in generated]
    output = request.buffer.copy()
    for row, (length, count) in enumerate(zip(request.lengths, counts)):
        output[row, length : length + count] = generated[row, :count]
    if not request.return_scores:
        return output, None
    scores = ops.convert_to_numpy(outputs[1])[:, :new]
    return output, np.where(np.arange(new)[None, :] < np.array(counts)[:, None], scores, 0.0).astype("float32")


def _loop_inputs(request: Request, width: int, biased: bool) -> tuple:
    """`decode_rows`' inputs but the model's, the request's prompts `width` columns wide."""
    limits = np.full(request.buffer.shape[0], request.max_new_tokens, "int32")
    return (_prompts(request, width), ops.convert_to_tensor(request.lengths), _settings(request, len(limits)),
            ops.convert_to_tensor(limits), *_ends_and_bias(request, biased))  # fmt: skip


def _prompts(request: Request, width: int):
    """The request's right-padded prompts, `width` columns wide (the padding past each row's length is never
    read: a row writes its new tokens over it)."""
    prompts = np.zeros((request.buffer.shape[0], width), request.buffer.dtype)
    prompts[:, : request.prompt_width] = request.buffer[:, : request.prompt_width]
    return ops.convert_to_tensor(prompts)


def room(width: int, steps: int, context: int) -> tuple[int, int]:
    """The prompts' width and the new tokens a compiled loop makes room for, for prompts `width` wide and
    `steps` new tokens, each `_rounded` up within the model's `context`, so that nearby lengths share one
    program (rows end at their own limits, and the loop once all have)."""
    wide = min(_rounded(width), context)
    if wide + steps > context:  # near the context's end: the prompts' own width
        wide = width
    return wide, max(steps, min(_rounded(steps), context - wide))


def _rounded(size: int) -> int:
    """`size` rounded up to a multiple of 8, and past 64 of a quarter of its power of two (80, 96, 112, 128, 160,
    ...): past 32, at most 1.25x (a wider prefill costs its share of the call)."""
    step = 8 if size <= 64 else 2 ** ((size - 1).bit_length() - 3)
    return -(-size // step) * step


def _loop(request: Request) -> Loop:
    """The row loop of a request: its rows end by themselves, with its scores and n-gram ban, in step where its
    prompts are of one length."""
    aligned = bool((request.lengths == request.lengths[0]).all())
    return Loop(ends=True, scores=request.return_scores, ngram=request.no_repeat_ngram_size, aligned=aligned)


def _settings(request: Request, rows: int, tensors: bool = True) -> RowSettings:
    """The request's settings for each of its `rows` (tensors, or NumPy columns), each row's seed its own
    (`row_seeds`)."""
    columns = (np.full(rows, value, np.asarray(value).dtype) for value in request.settings[:-1])
    settings = RowSettings(*columns, row_seeds(request.seed, rows))
    return RowSettings(*(ops.convert_to_tensor(column) for column in settings)) if tensors else settings


def _ends_and_bias(request: Request, biased: bool) -> tuple:
    """`(stops, bias)` as the row loop takes them: the stop ids (`[-1]` where none) and the `(1, vocabulary)`
    bias (`()` without one)."""
    stops = request.stop_token_ids if request.stop_token_ids.size else np.array([-1])
    bias = ops.convert_to_tensor(bias_of(request.logit_bias, request.vocabulary_size)[None, :]) if biased else ()
    return ops.convert_to_tensor(stops.astype("int32")), bias


def _count(new: np.ndarray, stop_token_ids: np.ndarray) -> int:
    """How many of a row's `new` tokens it keeps: up to and with its first stop token, else all."""
    stopped = np.flatnonzero(np.isin(new, stop_token_ids))
    return int(stopped[0]) + 1 if stopped.size else len(new)


def _beams(model, request: Request, inputs: tuple) -> np.ndarray:
    """The request's best beams, `(rows * num_return_sequences, total)` (`beam_search`), from a loop with
    `room` for its prompts and new tokens, as the row loop's."""
    width, steps = room(request.prompt_width, request.max_new_tokens, model.max_length)
    key, functions = ("beams", *request.compiled_key, width), model.compiled_decoding()  # built before a trace
    if key not in functions:
        step, while_loop = compiled.decoding_functions(model.call_with_cache, model)
        decoder = Decoder(step, while_loop, request.chooser, model.decoding_vocabulary_size)
        search = request.strategy.search

        def loop(batch, *inputs):
            copies = search.num_beams
            cache, context = model.decoding_cache(
                batch.buffer.shape[0] * copies, batch.buffer.shape[1], *inputs, copies=copies
            )
            return beam_decode(decoder, batch._replace(context=context), width, cache, search)

        functions[key] = compiled.compile_function(loop, model)
    total = request.buffer.shape[1]
    return ops.convert_to_numpy(functions[key](request.batch(columns=width + steps), *inputs))[:, :total]


def stream(model, request: Request, chunk_size: int) -> Iterator[tuple[np.ndarray, bool]]:
    """Decodes the request's one row on the row loop, its first new token alone, then `chunk_size` at a time,
    keeping its cache between chunks (a `RowState`); yields `(new, finished)`: the chunk's new tokens (the
    last a stop token where the row ended) and whether the row has ended."""
    features, loop = request.chooser.features, _loop(request)
    width, steps = room(request.prompt_width, request.max_new_tokens, model.max_length)
    length = width + steps  # the cache's: the prompt's and its new tokens'
    key, functions = ("stream", features, loop, length), model.compiled_decoding()
    if key not in functions:

        def start(prompts, lengths):
            return continuous.started(model, prompts, lengths, length, features, loop)

        functions[key] = compiled.compile_function(start, model)
    chunk = continuous.function(model, ("chunk", features, chunk_size, loop))
    cache, _, seen, history, context = functions[key](_prompts(request, width), ops.convert_to_tensor(request.lengths))
    stops, bias = _ends_and_bias(request, features.biased)
    limits = ops.convert_to_tensor(np.array([request.max_new_tokens], "int32"))
    state = RowState(cache, seen, chunk_size, Rows(stops, limits, history=history, context=context))
    prompt_length = int(request.lengths[0])
    settings = [column[0] for column in _settings(request, 1, tensors=False)]
    state.start(0, request.buffer[0, :prompt_length], prompt_length - 1, settings)
    while True:
        made = int(state.made[0])
        outputs = chunk(*state.chunk_inputs(chunk_size, bias))
        generated, _ = state.advance(*outputs[:2], ops.convert_to_numpy(outputs[2]), outputs[-1] if loop.ngram else ())
        run = min(generated.shape[1], request.max_new_tokens - made)
        new = generated[0, :run]
        count = _count(new, request.stop_token_ids)
        finished = (
            count < run or made + count >= request.max_new_tokens or bool(np.isin(new[-1], request.stop_token_ids))
        )
        yield new[:count], finished
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
    for new, finished in stream(model, request, chunk_size):
        taken = len(decoder.tokens)
        piece = decoder.feed(new, last=finished)
        if not text and len(decoder.tokens) > taken:
            yield np.asarray(decoder.tokens[taken:], new.dtype)
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
