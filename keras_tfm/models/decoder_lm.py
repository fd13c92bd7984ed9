"""DecoderLM: the modern decoder-only language model of the Llama family (Llama 2/3, Mistral, Qwen 2/2.5/3,
SmolLM), with cached generation.

tokens -> token embedding (no position table: positions rotate queries and keys, RoPE)
       -> num_layers x pre-norm DecoderBlock (RMSNorm, grouped-query causal self-attention with
          rotary positions, RMSNorm, SwiGLU feed-forward)
       -> final RMSNorm -> logits (tied to the token embedding, or a separate `lm_head`)
"""

from __future__ import annotations

import keras

from keras_tfm.errors import InputError
from keras_tfm.layers import DecoderBlock, RotaryEmbedding, TokenEmbedding
from keras_tfm.layers.arguments import check_arguments, is_integer
from keras_tfm.models.causal_lm import CausalLM


@keras.saving.register_keras_serializable(package="keras_tfm")
class DecoderLM(CausalLM):
    """A Llama-family language model: `model(token_ids)` gives next-token logits at every position.

    Args:
        vocabulary_size: number of token ids.
        max_length: the longest sequence it is meant for (`max_position_embeddings`): `generate`
            refuses longer ones. There is no position table, so a call may be longer.
        num_layers, num_heads, hidden_dim: depth, query heads, width.
        intermediate_dim: width of the SwiGLU feed-forward network.
        num_key_value_heads: key/value heads of grouped-query attention (1: multi-query); defaults
            to `num_heads`. The generation cache stores only these.
        head_dim: size of each head; defaults to `hidden_dim // num_heads` (Qwen3 sets it apart).
        rotary_embedding: arguments of `RotaryEmbedding` (`max_wavelength` is `rope_theta`; a
            `scaling` such as "llama3" with its factors); defaults to `{"max_wavelength": 10000.0}`.
        layer_norm_epsilon: of every RMSNorm (`rms_norm_eps`).
        tie_embeddings: the output projection reuses the token embedding table (SmolLM2, Qwen2.5
            0.5B, Llama 3.2 1B); False gives a separate `lm_head` (Llama 3 8B, Mistral).
        activation: of the gated feed-forward network ("silu": SwiGLU).
        attention_use_bias: biases on the query, key and value projections (Qwen2: True).
        attention_output_use_bias: a bias on the attention's output projection; defaults to
            `attention_use_bias` (Llama's `attention_bias` sets all four; Qwen2 has none here).
        feed_forward_use_bias: biases in the feed-forward network (Llama's `mlp_bias`).
        sliding_window: None, or each query sees only the last `sliding_window` positions (Mistral).
        sliding_window_layers: the indices of the layers that use the window (Qwen2's
            `max_window_layers`); None: every layer.
        query_key_norm: RMSNorm of each head's queries and keys (Qwen3).
        dropout: on embeddings and residual branches (training only).
        attention_dropout: on attention weights; defaults to `dropout`.
        remat: the blocks recompute their activations in training's backward pass (less memory).

    Call arguments:
        token_ids: int `(batch, length)`.
        padding_mask: optional `(batch, length)`, True at real tokens.

    Example:
    >>> model = keras_tfm.smollm2_135m()                     # weights made on first use
    >>> model.count_params()
    134515008
    >>> small = DecoderLM(vocabulary_size=65, max_length=64, num_layers=2, num_heads=4,
    ...                   hidden_dim=64, intermediate_dim=172, num_key_value_heads=2)
    >>> ids = small.generate([[1, 2, 3]], max_new_tokens=20)  # (1, 23) token ids
    """

    def __init__(
        self,
        vocabulary_size: int,
        max_length: int,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        intermediate_dim: int,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rotary_embedding: dict | None = None,
        layer_norm_epsilon: float = 1e-5,
        tie_embeddings: bool = True,
        activation: str = "silu",
        attention_use_bias: bool = False,
        attention_output_use_bias: bool | None = None,
        feed_forward_use_bias: bool = False,
        sliding_window: int | None = None,
        sliding_window_layers: list[int] | None = None,
        query_key_norm: bool = False,
        dropout: float = 0.0,
        attention_dropout: float | None = None,
        remat: bool = False,
        **kwargs,
    ):
        check_arguments(
            "DecoderLM",
            locals(),
            optional=(
                "num_key_value_heads",
                "head_dim",
                "rotary_embedding",
                "attention_output_use_bias",
                "sliding_window",
                "attention_dropout",
            ),
        )
        if head_dim is None:
            self._check_heads("DecoderLM", hidden_dim, num_heads)
        self._check_layout(num_heads, num_key_value_heads, num_layers, sliding_window_layers)
        rotary_embedding = {"max_wavelength": 10000.0, **(rotary_embedding or {})}
        RotaryEmbedding(**rotary_embedding)  # refuses bad rotary arguments now, not at the first call
        kwargs.setdefault("name", "decoder_lm")
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.max_length = max_length
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_key_value_heads = num_key_value_heads or num_heads
        self.head_dim = head_dim or hidden_dim // num_heads
        self.rotary_embedding = rotary_embedding
        self.layer_norm_epsilon = layer_norm_epsilon
        self.tie_embeddings = tie_embeddings
        self.activation = activation
        self.attention_use_bias = attention_use_bias
        self.attention_output_use_bias = (
            attention_use_bias if attention_output_use_bias is None else attention_output_use_bias
        )
        self.feed_forward_use_bias = feed_forward_use_bias
        self.sliding_window = sliding_window
        self.sliding_window_layers = None if sliding_window_layers is None else [int(i) for i in sliding_window_layers]
        self.query_key_norm = query_key_norm
        self.dropout = dropout
        self.attention_dropout = dropout if attention_dropout is None else attention_dropout

        self._make_layers(remat)
        self._compile_defaults()

    @staticmethod
    def _check_layout(num_heads: int, num_key_value_heads, num_layers: int, sliding_window_layers) -> None:
        """Refuses query heads that key/value heads cannot group, and window layers that do not exist."""
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise InputError(
                f"num_heads must be a multiple of num_key_value_heads; received num_heads={num_heads}, "
                f"num_key_value_heads={num_key_value_heads}.",
                "num_key_value_heads",
                caller="DecoderLM",
            )
        if sliding_window_layers is not None and (
            isinstance(sliding_window_layers, str)
            or not all(is_integer(i) and 0 <= i < num_layers for i in sliding_window_layers)
        ):
            raise InputError(
                f"sliding_window_layers must be None or a list of layer indices in [0, num_layers="
                f"{num_layers}); received {sliding_window_layers!r}.",
                "sliding_window_layers",
                caller="DecoderLM",
            )

    def _make_layers(self, remat: bool) -> None:
        """The token table, the blocks, the final norm and the head, from the settings."""
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.token_embedding = TokenEmbedding(
            self.vocabulary_size,
            self.hidden_dim,
            embeddings_initializer=init,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.embedding_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name="embedding_dropout")
        self.blocks = [
            DecoderBlock(
                self.num_heads,
                self.intermediate_dim,
                key_dim=self.head_dim,
                dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                activation=self.activation,
                norm_first=True,
                layer_norm_epsilon=self.layer_norm_epsilon,
                kernel_initializer=init,
                remat=remat,
                num_key_value_heads=self.num_key_value_heads,
                normalization="rms_norm",
                gated_feed_forward=True,
                attention_use_bias=self.attention_use_bias,
                attention_output_use_bias=self.attention_output_use_bias,
                feed_forward_use_bias=self.feed_forward_use_bias,
                rotary_embedding=self.rotary_embedding,
                sliding_window=self._window_of(i),
                query_key_norm_epsilon=self.layer_norm_epsilon if self.query_key_norm else None,
                dtype=self.dtype_policy,
                name=f"block_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.final_norm = keras.layers.RMSNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
        )
        self.lm_head = self._output_head(self.tie_embeddings, init)

    def _window_of(self, layer: int) -> int | None:
        if self.sliding_window_layers is None or layer in self.sliding_window_layers:
            return self.sliding_window
        return None

    def _embed(self, token_ids, start_index=0, training=None):
        return self.embedding_dropout(self.token_embedding(token_ids), training=training)


def _sized(defaults: dict, overrides: dict) -> DecoderLM:
    return DecoderLM(**{**defaults, **overrides})


def smollm2_135m(**overrides) -> DecoderLM:
    """SmolLM2-135M: 30 layers, 9 query and 3 key/value heads, 576 wide, vocabulary 49152 (134,515,008 parameters)."""
    return _sized(
        dict(
            vocabulary_size=49152,
            max_length=8192,
            num_layers=30,
            num_heads=9,
            num_key_value_heads=3,
            hidden_dim=576,
            intermediate_dim=1536,
            rotary_embedding=dict(max_wavelength=100000.0),
        ),
        overrides,
    )


def smollm2_360m(**overrides) -> DecoderLM:
    """SmolLM2-360M: 32 layers, 15 query and 5 key/value heads, 960 wide."""
    return _sized(
        dict(
            vocabulary_size=49152,
            max_length=8192,
            num_layers=32,
            num_heads=15,
            num_key_value_heads=5,
            hidden_dim=960,
            intermediate_dim=2560,
            rotary_embedding=dict(max_wavelength=100000.0),
        ),
        overrides,
    )


def qwen2_5_0_5b(**overrides) -> DecoderLM:
    """Qwen2.5-0.5B: 24 layers, 14 query and 2 key/value heads, 896 wide, query/key/value biases
    (494,032,768 parameters)."""
    return _sized(
        dict(
            vocabulary_size=151936,
            max_length=32768,
            num_layers=24,
            num_heads=14,
            num_key_value_heads=2,
            hidden_dim=896,
            intermediate_dim=4864,
            rotary_embedding=dict(max_wavelength=1000000.0),
            layer_norm_epsilon=1e-6,
            attention_use_bias=True,
            attention_output_use_bias=False,
        ),
        overrides,
    )


def qwen3_0_6b(**overrides) -> DecoderLM:
    """Qwen3-0.6B: 28 layers, 16 query and 8 key/value heads of 128, 1024 wide, QK-norm."""
    return _sized(
        dict(
            vocabulary_size=151936,
            max_length=40960,
            num_layers=28,
            num_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            hidden_dim=1024,
            intermediate_dim=3072,
            rotary_embedding=dict(max_wavelength=1000000.0),
            layer_norm_epsilon=1e-6,
            query_key_norm=True,
        ),
        overrides,
    )


def llama3_2_1b(**overrides) -> DecoderLM:
    """Llama 3.2 1B: 16 layers, 32 query and 8 key/value heads, 2048 wide, llama3 RoPE scaling
    (1,235,814,400 parameters)."""
    return _sized(
        dict(
            vocabulary_size=128256,
            max_length=131072,
            num_layers=16,
            num_heads=32,
            num_key_value_heads=8,
            hidden_dim=2048,
            intermediate_dim=8192,
            rotary_embedding=dict(
                max_wavelength=500000.0,
                scaling="llama3",
                scaling_factor=32.0,
                low_frequency_factor=1.0,
                high_frequency_factor=4.0,
                original_max_length=8192,
            ),
        ),
        overrides,
    )


def llama3_8b(**overrides) -> DecoderLM:
    """Llama 3 8B: 32 layers, 32 query and 8 key/value heads, 4096 wide, untied output."""
    return _sized(
        dict(
            vocabulary_size=128256,
            max_length=8192,
            num_layers=32,
            num_heads=32,
            num_key_value_heads=8,
            hidden_dim=4096,
            intermediate_dim=14336,
            rotary_embedding=dict(max_wavelength=500000.0),
            tie_embeddings=False,
        ),
        overrides,
    )


def mistral_7b(**overrides) -> DecoderLM:
    """Mistral 7B (v0.1): 32 layers, 32 query and 8 key/value heads, 4096 wide, sliding window 4096."""
    return _sized(
        dict(
            vocabulary_size=32000,
            max_length=32768,
            num_layers=32,
            num_heads=32,
            num_key_value_heads=8,
            hidden_dim=4096,
            intermediate_dim=14336,
            rotary_embedding=dict(max_wavelength=10000.0),
            tie_embeddings=False,
            sliding_window=4096,
        ),
        overrides,
    )


def llama_shakespeare_char(**overrides) -> DecoderLM:
    """`gpt_shakespeare_char` in the Llama form: 6 layers, 6 heads, 384 wide, SwiGLU 1024, context 256."""
    return _sized(
        dict(
            vocabulary_size=65,
            max_length=256,
            num_layers=6,
            num_heads=6,
            hidden_dim=384,
            intermediate_dim=1024,
            dropout=0.2,
        ),
        overrides,
    )


def llama_shakespeare_char_cpu(**overrides) -> DecoderLM:
    """`gpt_shakespeare_char_cpu` in the Llama form: 4 layers, 4 heads, 128 wide, SwiGLU 344, context 64
    (about the GPT's parameters: three projections of 344 for its two of 512)."""
    return _sized(
        dict(vocabulary_size=65, max_length=64, num_layers=4, num_heads=4, hidden_dim=128, intermediate_dim=344),
        overrides,
    )
