"""`generate` with a grammar (`json_schema`): the request's rows run through the server's row loop
(`continuous`), one step per call, each row's next token held to its grammar by a host bias
(`grammar.Constraint`); the compiled whole-sequence loop of `orchestration` has no step at which the
host could give one. Rows choose their tokens with `generate`'s chooser and seeds."""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_tfm.generation import continuous
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.generation.grammar import Constraint, schema_grammar
from keras_tfm.generation.request import Request
from keras_tfm.generation.sampling import row_seeds


def run(model, request: Request, config: GenerationConfig) -> tuple[np.ndarray, np.ndarray]:
    """The request's buffer `(rows, total)` decoded as `orchestration.run` returns it, each row's new
    tokens JSON that follows `config.json_schema` (and the stop token the grammar allows after it), and
    each row's count of new tokens (a grammar without a stop token ends a row before its padding)."""
    grammar = schema_grammar(config.json_schema)
    rows, total = request.buffer.shape
    constraints = [Constraint(model, grammar) for _ in range(rows)]
    cache, seen = _prefilled(model, request)
    settings = continuous.settings_of([config] * rows, row_seeds(config.seed, rows))
    features = continuous.features_of(settings)._replace(biased=True)
    chunk = continuous.function(model, ("chunk", features, 1))
    settings = continuous.RowSettings(*(ops.convert_to_tensor(value) for value in settings))
    output, lengths = request.buffer.copy(), request.lengths
    positions = (lengths - 1).astype("int32")
    tokens = output[np.arange(rows), positions]
    logit_bias = continuous.host_bias(config, model.decoding_vocabulary_size)
    stops, ended, counts = set(request.stop_token_ids.tolist()), np.zeros(rows, bool), np.zeros(rows, "int32")
    fed = tuple(ops.convert_to_tensor(part) for part in continuous.nothing_fed(rows, 1))
    for step in range(request.max_new_tokens):
        bias = np.stack([constraint.bias() for constraint in constraints]) + logit_bias
        cache, seen, generated = chunk(
            cache,
            ops.convert_to_tensor(tokens),
            ops.convert_to_tensor(positions),
            seen,
            settings,
            fed,
            ops.convert_to_tensor(bias),
        )
        tokens = ops.convert_to_numpy(generated)[:, 0].astype("int32")
        for row in np.flatnonzero(~ended):
            output[row, lengths[row] + step], counts[row] = tokens[row], step + 1
            complete = constraints[row].take(tokens[row])
            ended[row] = complete or int(tokens[row]) in stops
        positions = np.minimum(positions + 1, total - 1).astype("int32")
        if ended.all():
            break
    return output, counts  # after its end, a row holds the buffer's padding


def _prefilled(model, request: Request):
    """The cache of the prompts' keys and values, `total` positions long, and each row's seen tokens."""
    rows, total = request.buffer.shape
    filled = continuous.function(model, ("prefill",))(ops.convert_to_tensor(request.buffer[:, : request.prompt_width]))
    seen_rows = np.zeros((rows, model.decoding_vocabulary_size), "int32")
    for row, length in enumerate(request.lengths):
        seen_rows[row, request.buffer[row, :length]] = 1
    everyone = list(range(rows))
    return continuous.admit(
        model.empty_cache(rows, total),
        ops.zeros((rows, model.decoding_vocabulary_size), "int32"),
        filled,
        everyone,
        everyone,
        seen_rows,
    )
