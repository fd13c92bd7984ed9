"""The shared checks (config, .keras, mixed precision) for every layer."""

import numpy as np
import pytest

from keras_tfm import layers
from tests.checks import run_layer_checks

RNG = np.random.default_rng(0)
TOKENS = RNG.integers(1, 50, size=(2, 8)).astype("int32")
SEQUENCE = RNG.normal(size=(2, 8, 32)).astype("float32")
SOURCE = RNG.normal(size=(2, 5, 32)).astype("float32")
IMAGES = RNG.normal(size=(2, 16, 16, 3)).astype("float32")
FEATURE_MAP = RNG.normal(size=(2, 6, 8, 32)).astype("float32")

CASES = {
    "token_embedding": (lambda **kw: layers.TokenEmbedding(50, 32, **kw), (TOKENS,), {}),
    "token_embedding_reverse": (lambda **kw: layers.TokenEmbedding(50, 32, **kw), (SEQUENCE,), {"reverse": True}),
    "patch_embedding": (lambda **kw: layers.PatchEmbedding(4, 32, **kw), (IMAGES,), {}),
    "learned_positions": (lambda **kw: layers.LearnedPositionEmbedding(16, **kw), (SEQUENCE,), {}),
    "attention": (lambda **kw: layers.MultiHeadAttention(4, 8, **kw), (SEQUENCE,), {"use_causal_mask": True}),
    "cross_attention": (lambda **kw: layers.MultiHeadAttention(4, 8, value_dim=6, **kw), (SEQUENCE, SOURCE), {}),
    "feed_forward": (lambda **kw: layers.FeedForward(64, **kw), (SEQUENCE,), {}),
    "encoder_block_pre_norm": (lambda **kw: layers.EncoderBlock(4, 64, **kw), (SEQUENCE,), {}),
    "encoder_block_post_norm": (
        lambda **kw: layers.EncoderBlock(4, 64, norm_first=False, dropout=0.1, **kw),
        (SEQUENCE,),
        {},
    ),
    "attention_pooling": (lambda **kw: layers.AttentionPooling(4, 48, **kw), (SEQUENCE,), {}),
    "overlapping_patch_embedding": (lambda **kw: layers.OverlappingPatchEmbedding(3, 2, 32, **kw), (IMAGES,), {}),
    "mix_transformer_block": (
        lambda **kw: layers.MixTransformerBlock(4, 64, reduction_ratio=2, dropout=0.1, **kw),
        (FEATURE_MAP,),
        {},
    ),
    "detection_head": (lambda **kw: layers.DetectionHead(3, **kw), (SEQUENCE,), {}),
    "token_pooling": (lambda **kw: layers.TokenPooling(("mean", "max", "lasttoken"), **kw), (SEQUENCE,), {}),
    "decoder_block": (lambda **kw: layers.DecoderBlock(4, 64, **kw), (SEQUENCE,), {}),
    "decoder_block_cross": (
        lambda **kw: layers.DecoderBlock(4, 64, use_cross_attention=True, norm_first=False, **kw),
        (SEQUENCE, SOURCE),
        {},
    ),
    "decoder_block_cross_remat": (
        lambda **kw: layers.DecoderBlock(4, 64, use_cross_attention=True, dropout=0.1, remat=True, **kw),
        (SEQUENCE, SOURCE),
        {},
    ),
}
# AllMLPDecoder (a list of maps in) gets them inside SegFormer (tests/models/test_segformer.py).
# Fixed encodings have no weights to train; they get the config and saving checks in test_positions.
# The Llama form of DecoderBlock (RMSNorm, GQA, RoPE, window, QK-norm, SwiGLU) gets them inside DecoderLM
# (tests/models/test_decoder_lm.py) and in the every-layer model (test_all_layers.py).


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_passes_common_checks(name, tmp_path):
    """Config, `.keras` file and mixed precision. Training: every layer in the every-layer model's compiled
    fit (test_all_layers.py, which checks that each of their weights moves), and in the models' checks."""
    make_layer, args, kwargs = CASES[name]
    run_layer_checks(make_layer, args, kwargs, tmp_path=tmp_path, fit=False)
