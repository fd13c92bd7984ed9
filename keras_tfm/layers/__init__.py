"""The transformer building blocks. Every layer speaks `keras.ops` only and runs on TensorFlow,
JAX and PyTorch."""

from keras_tfm.layers.all_mlp_decoder import AllMLPDecoder
from keras_tfm.layers.attention import MultiHeadAttention
from keras_tfm.layers.attention_pooling import AttentionPooling
from keras_tfm.layers.blocks import DecoderBlock, EncoderBlock
from keras_tfm.layers.conv_segmentation_head import ConvSegmentationHead
from keras_tfm.layers.depth_head import DepthHead
from keras_tfm.layers.detection_head import DetectionHead
from keras_tfm.layers.dpt_neck import DPTNeck
from keras_tfm.layers.drop_path import DropPath
from keras_tfm.layers.embeddings import PatchEmbedding, TokenEmbedding
from keras_tfm.layers.feed_forward import FeedForward, GatedFeedForward
from keras_tfm.layers.layer_scale import LayerScale
from keras_tfm.layers.masked_image_decoder import MaskedImageDecoder
from keras_tfm.layers.mix_transformer_block import MixTransformerBlock
from keras_tfm.layers.overlapping_patch_embedding import OverlappingPatchEmbedding
from keras_tfm.layers.positions import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    SinusoidalPositionEncoding2D,
)
from keras_tfm.layers.rotary import RotaryEmbedding
from keras_tfm.layers.task_heads import (
    HeadTransform,
    MaskedLMHead,
    SequenceClassificationHead,
    SpanHead,
    TokenClassificationHead,
)
from keras_tfm.layers.token_pooling import TokenPooling

__all__ = [
    "AllMLPDecoder",
    "AttentionPooling",
    "ConvSegmentationHead",
    "DecoderBlock",
    "DepthHead",
    "DetectionHead",
    "DPTNeck",
    "DropPath",
    "EncoderBlock",
    "FeedForward",
    "GatedFeedForward",
    "HeadTransform",
    "LayerScale",
    "LearnedPositionEmbedding",
    "MaskedImageDecoder",
    "MaskedLMHead",
    "MixTransformerBlock",
    "MultiHeadAttention",
    "OverlappingPatchEmbedding",
    "PatchEmbedding",
    "RotaryEmbedding",
    "SequenceClassificationHead",
    "SinusoidalPositionEncoding",
    "SinusoidalPositionEncoding2D",
    "SpanHead",
    "TokenClassificationHead",
    "TokenEmbedding",
    "TokenPooling",
]
