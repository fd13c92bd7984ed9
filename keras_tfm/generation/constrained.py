"""`generate` with a grammar (`json_schema`): the request's rows run through the row loop (`continuous`) one
step per call, each row's next token held to its grammar by a host bias (`grammar.Constraint`), which the host
gives between two steps. Rows choose their tokens with `generate`'s chooser and seeds, and an n-gram ban gives way
where it would leave no token the grammar allows (JSON repeats `":` after every key)."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.generation import continuous
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.continuous import NO_ROWS
from keras_tfm.generation.grammar import Constraint, schema_grammar
from keras_tfm.generation.request import Request
from keras_tfm.generation.rows import RowState
from keras_tfm.generation.sampling import RowSettings, bias_of, features_of, row_seeds, row_values


def run(model, request: Request, config: GenerationConfig) -> tuple[np.ndarray, np.ndarray]:
    """The request's buffer `(rows, total)` decoded as `orchestration.run` returns it, each row's new
    tokens JSON that follows `config.json_schema` (and the stop token the grammar allows after it), and
    each row's count of new tokens (a grammar without a stop token ends a row before its padding)."""
    grammar = schema_grammar(config.json_schema)
    rows, total = request.buffer.shape
    constraints = [Constraint(model, grammar) for _ in range(rows)]
    constraints[0].check_writable()
    state = _prefilled(model, request, config)
    features = features_of(RowSettings(*state.settings))._replace(biased=True)
    ngram = request.no_repeat_ngram_size
    chunk = continuous.function(model, ("chunk", features, 1, *[continuous.Loop(ngram=ngram)] * bool(ngram)))
    output, lengths = request.buffer.copy(), request.lengths
    logit_bias = bias_of(config.logit_bias, model.decoding_vocabulary_size)
    stops, ended, counts = set(request.stop_token_ids.tolist()), np.zeros(rows, bool), np.zeros(rows, "int32")
    for step in range(request.max_new_tokens):
        bias = np.stack([constraint.bias() for constraint in constraints]) + logit_bias
        cache, seen, generated, *history = chunk(*state.chunk_inputs(1, ops.convert_to_tensor(bias)))
        state.advance(cache, seen, ops.convert_to_numpy(generated), *history)  # one step: each row's next token
        for row in np.flatnonzero(~ended):
            output[row, lengths[row] + step], counts[row] = state.tokens[row], step + 1
            complete = constraints[row].take(state.tokens[row])
            ended[row] = complete or int(state.tokens[row]) in stops
        if ended.all():
            break
    return output, counts  # after its end, a row holds the buffer's padding


def _prefilled(model, request: Request, config: GenerationConfig) -> RowState:
    """The request's rows with their prompts' keys and values in a cache `total` positions long, each to
    feed its prompt's last token next, with `config`'s settings and `generate`'s row seeds (and the rows' tokens
    by position, for an n-gram ban)."""
    rows, total = request.buffer.shape
    ids, last = request.buffer[:, : request.prompt_width], request.lengths.astype("int32") - 1
    filled, _ = continuous.function(model, ("prefill",))(ops.convert_to_tensor(ids), ops.convert_to_tensor(last))
    seen_rows = np.zeros((rows, model.decoding_vocabulary_size), "int32")
    for row, length in enumerate(request.lengths):
        seen_rows[row, request.buffer[row, :length]] = 1
    carried = continuous.Rows(history=ops.convert_to_tensor(request.buffer.astype("int32")))
    state = RowState.empty(model, rows, total, steps=1, carried=carried if request.no_repeat_ngram_size else NO_ROWS)
    everyone = list(range(rows))
    state.admit(filled, everyone, everyone, seen_rows)
    for row, (length, seed) in enumerate(zip(request.lengths, row_seeds(config.seed, rows))):
        state.start(row, request.buffer[row, :length], int(length) - 1, row_values(config, seed))
    return state
