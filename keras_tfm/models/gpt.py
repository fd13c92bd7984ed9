"""GPT: a decoder-only causal language model (GPT-2 layout), with cached generation.

tokens -> token embedding + learned positions -> dropout
       -> num_layers x pre-norm DecoderBlock (causal self-attention, MLP)
       -> final LayerNorm -> logits (tied to the token embedding by default)
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_tfm.generation import compiled, decoding
from keras_tfm.generation.beam_search import beam_decode
from keras_tfm.generation.sampling import Sampler, check_decoding
from keras_tfm.layers import DecoderBlock, LearnedPositionEmbedding, TokenEmbedding
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.models.model import Model


@keras.saving.register_keras_serializable(package="keras_tfm")
class GPT(Model):
    """A GPT language model: `model(token_ids)` gives next-token logits at every position.

    Args:
        vocabulary_size: number of token ids.
        max_length: longest sequence (the position table); longer inputs raise `ValueError`.
        num_layers, num_heads, hidden_dim: depth, attention heads, width.
        intermediate_dim: MLP width; defaults to `4 * hidden_dim`.
        dropout: on embeddings and residual branches (training only).
        attention_dropout: on attention weights; defaults to `dropout`.
        layer_norm_epsilon: of every LayerNorm.
        tie_embeddings: the output projection reuses the token embedding table (GPT-2); False
            gives a separate `lm_head` without bias.
        activation: of the MLP; GPT-2 uses the tanh approximation of GELU.
        remat: the blocks recompute their activations in training's backward pass (less memory).

    Call arguments:
        token_ids: int `(batch, length)`.
        padding_mask: optional `(batch, length)`, True at real tokens. Causal attention already
            hides right padding from real tokens; the mask matters for left padding.

    Example:
    >>> model = GPT(vocabulary_size=65, max_length=64, num_layers=4, num_heads=4, hidden_dim=128)
    >>> logits = model(np.zeros((2, 64), "int32"))               # (2, 64, 65)
    >>> model.generate([[1, 2, 3]], max_new_tokens=20)            # (1, 23) token ids
    """

    def __init__(
        self,
        vocabulary_size: int,
        max_length: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        intermediate_dim: int | None = None,
        dropout: float = 0.0,
        attention_dropout: float | None = None,
        layer_norm_epsilon: float = 1e-5,
        tie_embeddings: bool = True,
        activation: str = "gelu_approximate",
        remat: bool = False,
        **kwargs,
    ):
        check_arguments("GPT", locals(), optional=("intermediate_dim", "attention_dropout"))
        kwargs.setdefault("name", "gpt")
        self._check_heads("GPT", hidden_dim, num_heads)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.max_length = max_length
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim or 4 * hidden_dim
        self.dropout = dropout
        self.attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.tie_embeddings = tie_embeddings
        self.activation = activation

        init = keras.initializers.RandomNormal(stddev=0.02)
        self.token_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=init, dtype=self.dtype_policy, name="token_embedding"
        )
        self.position_embedding = LearnedPositionEmbedding(
            max_length, initializer=init, dtype=self.dtype_policy, name="position_embedding"
        )
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="embedding_dropout")
        self.blocks = [
            DecoderBlock(
                num_heads,
                self.intermediate_dim,
                dropout=dropout,
                attention_dropout=self.attention_dropout,
                activation=activation,
                norm_first=True,
                layer_norm_epsilon=layer_norm_epsilon,
                kernel_initializer=init,
                remat=remat,
                dtype=self.dtype_policy,
                name=f"block_{i}",
            )
            for i in range(num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
        )
        self.lm_head = (
            None
            if tie_embeddings
            else keras.layers.Dense(
                vocabulary_size, use_bias=False, kernel_initializer=init, dtype=self.dtype_policy, name="lm_head"
            )
        )
        self._generate_functions: dict = {}

    def build(self, token_ids_shape=None):
        self.call(ops.zeros((1, min(2, self.max_length)), "int32"))  # builds every sub-layer
        self.built = True

    def _id_inputs(self) -> dict:
        return {"token_ids": (self.vocabulary_size, "vocabulary_size")}

    def _label_range(self) -> tuple[int, str]:
        return self.vocabulary_size, "vocabulary_size"

    def _embed(self, token_ids, start_index=0, training=None):
        x = self.token_embedding(token_ids)
        x = x + self.position_embedding(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def _logits(self, hidden):
        hidden = self.final_norm(hidden)
        if self.tie_embeddings:
            return self.token_embedding(hidden, reverse=True)
        return self.lm_head(hidden)

    def call(self, token_ids, padding_mask=None, training=None):
        x = self._embed(token_ids, training=training)
        for block in self.blocks:
            x = block(x, decoder_padding_mask=padding_mask, training=training)
        return self._logits(x)

    def call_with_cache(self, token_ids, cache, cache_update_index, output_logits: bool = True):
        """Logits for `token_ids` placed at positions `cache_update_index, ...`, reading and
        updating `cache`: one `(batch, 2, num_heads, cache_length, head_dim)` key/value tensor per
        layer (a tuple, not one stacked tensor, so a step copies no layer's cache twice).
        `output_logits=False` returns `None` instead of the logits: a prefill that only fills the
        cache skips the vocabulary projection and, in the last block, everything but the keys and
        values (`DecoderBlock.update_cache`)."""
        x = self._embed(token_ids, start_index=cache_update_index)
        updated = []
        for i, (block, layer_cache) in enumerate(zip(self.blocks, cache)):
            if not output_logits and i == len(self.blocks) - 1:  # nothing reads the last block's output
                updated.append(block.update_cache(x, layer_cache, cache_update_index))
                return None, tuple(updated)
            x, layer_cache = block(x, self_attention_cache=layer_cache, cache_update_index=cache_update_index)
            updated.append(layer_cache)
        return self._logits(x), tuple(updated)

    def empty_cache(self, batch_size: int, length: int) -> tuple:
        head_dim = self.hidden_dim // self.num_heads
        shape = (batch_size, 2, self.num_heads, length, head_dim)
        return tuple(ops.zeros(shape, self.compute_dtype) for _ in self.blocks)

    def generate(
        self,
        token_ids,
        max_new_tokens: int,
        padding_mask=None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids=(),
        pad_token_id: int = 0,
        num_beams: int = 1,
        length_penalty: float = 1.0,
    ) -> np.ndarray:
        """Continues each prompt by up to `max_new_tokens` tokens with a key/value cache.

        Args:
            token_ids: a list of prompts (lists of ids, lengths may differ), or an int array
                `(batch, length)` with `padding_mask` (True at real tokens, padding on the right).
            max_new_tokens: tokens to add to each prompt.
            temperature, top_k, top_p: sampling; `temperature=0` (default) is greedy.
            seed: makes sampling reproducible.
            stop_token_ids: an id or ids; a row stops after generating one of them (it is kept).
            pad_token_id: fills a row after it stops, and the tail of shorter rows.
            num_beams: > 1 runs beam search (deterministic; the sampling arguments are ignored).
            length_penalty: beams are ranked by log-probability / length ** length_penalty.

        Returns:
            int array `(batch, prompt_length + max_new_tokens)`: row `i` holds its prompt followed
            directly by its new tokens, then `pad_token_id`.

        The decoding loop is compiled once per sampler setting and reused: XLA on JAX and
        TensorFlow; on PyTorch the loop body (greedy, beam search) or the model step (sampling) is
        recorded once with `torch.jit.trace` and replayed.
        """
        check_decoding(
            "GPT.generate",
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            length_penalty=length_penalty,
            pad_token_id=pad_token_id,
            vocabulary_size=self.vocabulary_size,
        )
        self._build_on_demand()  # weights must exist before the loop is traced
        sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p)
        buffer, prompt_mask, lengths = decoding.prepare_prompts(
            token_ids, padding_mask, max_new_tokens, pad_token_id, self.vocabulary_size
        )
        if isinstance(stop_token_ids, (int, np.integer)):
            stop_token_ids = [stop_token_ids]
        stop_token_ids = decoding.as_token_ids(list(stop_token_ids), "stop_token_ids", self.vocabulary_size)
        if buffer.shape[1] > self.max_length:
            raise ValueError(
                f"GPT.generate: prompt length {buffer.shape[1] - max_new_tokens} + max_new_tokens "
                f"{max_new_tokens} exceeds max_length={self.max_length}."
            )
        prompt_width = buffer.shape[1] - max_new_tokens
        key = (sampler, prompt_width, num_beams, length_penalty)
        if key not in self._generate_functions:
            step, while_loop = compiled.decoding_functions(
                self.call_with_cache, self, traceable=sampler.greedy or num_beams > 1
            )

            def run(buffer, prompt_mask, lengths, max_new, stops, pad, seed_state):
                cache = self.empty_cache(buffer.shape[0] * num_beams, buffer.shape[1])
                if num_beams > 1:
                    best = beam_decode(
                        step,
                        cache,
                        buffer,
                        prompt_mask,
                        lengths,
                        prompt_width,
                        max_new,
                        stops,
                        pad,
                        num_beams,
                        length_penalty,
                        while_loop,
                    )
                    return best, seed_state
                return decoding.decode(
                    step,
                    cache,
                    buffer,
                    prompt_mask,
                    lengths,
                    prompt_width,
                    max_new,
                    stops,
                    pad,
                    seed_state,
                    sampler,
                    while_loop,
                )

            self._generate_functions[key] = compiled.compile_function(run, self)
        output, _ = self._generate_functions[key](
            ops.convert_to_tensor(buffer),
            ops.convert_to_tensor(prompt_mask),
            ops.convert_to_tensor(lengths),
            ops.convert_to_tensor(max_new_tokens, "int32"),
            ops.convert_to_tensor(stop_token_ids if stop_token_ids.size else np.array([-1], "int32")),
            ops.convert_to_tensor(pad_token_id, "int32"),
            decoding.initial_seed_state(seed),
        )
        return ops.convert_to_numpy(output)


def gpt2_small(**overrides) -> GPT:
    """GPT-2 124M: 12 layers, 12 heads, 768 wide, context 1024, vocabulary 50257."""
    return GPT(
        **{**dict(vocabulary_size=50257, max_length=1024, num_layers=12, num_heads=12, hidden_dim=768), **overrides}
    )


def gpt2_medium(**overrides) -> GPT:
    """GPT-2 355M: 24 layers, 16 heads, 1024 wide."""
    return GPT(
        **{**dict(vocabulary_size=50257, max_length=1024, num_layers=24, num_heads=16, hidden_dim=1024), **overrides}
    )


def gpt2_large(**overrides) -> GPT:
    """GPT-2 774M: 36 layers, 20 heads, 1280 wide."""
    return GPT(
        **{**dict(vocabulary_size=50257, max_length=1024, num_layers=36, num_heads=20, hidden_dim=1280), **overrides}
    )


def gpt2_xl(**overrides) -> GPT:
    """GPT-2 1.5B: 48 layers, 25 heads, 1600 wide."""
    return GPT(
        **{**dict(vocabulary_size=50257, max_length=1024, num_layers=48, num_heads=25, hidden_dim=1600), **overrides}
    )


def gpt_shakespeare_char(**overrides) -> GPT:
    """nanoGPT's character-level Shakespeare model: 6 layers, 6 heads, 384 wide, context 256."""
    return GPT(
        **{
            **dict(vocabulary_size=65, max_length=256, num_layers=6, num_heads=6, hidden_dim=384, dropout=0.2),
            **overrides,
        }
    )


def gpt_shakespeare_char_cpu(**overrides) -> GPT:
    """nanoGPT's CPU run: 4 layers, 4 heads, 128 wide, context 64, no dropout."""
    return GPT(**{**dict(vocabulary_size=65, max_length=64, num_layers=4, num_heads=4, hidden_dim=128), **overrides})
