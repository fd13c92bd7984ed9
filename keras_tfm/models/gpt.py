"""GPT: a decoder-only causal language model (GPT-2 layout), with cached generation.

tokens -> token embedding + learned positions -> dropout
       -> num_layers x pre-norm DecoderBlock (causal self-attention, MLP)
       -> final LayerNorm -> logits (tied to the token embedding by default)
"""

from __future__ import annotations

import keras

from keras_tfm.layers import DecoderBlock, LearnedPositionEmbedding, TokenEmbedding
from keras_tfm.layers.arguments import check_arguments
from keras_tfm.models.causal_lm import CausalLM


@keras.saving.register_keras_serializable(package="keras_tfm")
class GPT(CausalLM):
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
    >>> ids = model.generate([[1, 2, 3]], max_new_tokens=20)  # (1, 23) token ids
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
        self.lm_head = self._output_head(tie_embeddings, init)
        self._compile_defaults()

    def _embed(self, token_ids, start_index=0, training=None):
        x = self.token_embedding(token_ids)
        x = x + self.position_embedding(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)


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
