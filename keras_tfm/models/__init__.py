"""The model zoo: one configurable class per model, and its named sizes as plain functions."""

from keras_tfm.models.bert import Bert, BertClassifier, BertMLM, BertQuestionAnswerer, BertTokenClassifier
from keras_tfm.models.bert_sizes import (
    bert_base,
    bert_large,
    bert_medium,
    bert_mini,
    bert_small,
    bert_tiny,
    distilbert_base,
    roberta_base,
    roberta_large,
    xlm_roberta_base,
)
from keras_tfm.models.causal_lm import CausalLM
from keras_tfm.models.clip import (
    CLIP,
    CLIPTextEncoder,
    clip_vit_base_patch16,
    clip_vit_base_patch32,
    clip_vit_large_patch14,
    clip_vit_large_patch14_336,
)
from keras_tfm.models.decoder_lm import (
    DecoderLM,
    llama3_2_1b,
    llama3_8b,
    llama_shakespeare_char,
    llama_shakespeare_char_cpu,
    mistral_7b,
    qwen2_5_0_5b,
    qwen3_0_6b,
    smollm2_135m,
    smollm2_360m,
)
from keras_tfm.models.dpt import (
    DPT,
    depth_anything_v2_base,
    depth_anything_v2_large,
    depth_anything_v2_small,
    dpt_large,
)
from keras_tfm.models.gpt import (
    GPT,
    gpt2_large,
    gpt2_medium,
    gpt2_small,
    gpt2_xl,
    gpt_shakespeare_char,
    gpt_shakespeare_char_cpu,
)
from keras_tfm.models.modern_bert import (
    ModernBert,
    ModernBertClassifier,
    ModernBertMLM,
    ModernBertQuestionAnswerer,
    ModernBertTokenClassifier,
    modernbert_base,
    modernbert_large,
)
from keras_tfm.models.segformer import (
    SegFormer,
    segformer_b0,
    segformer_b1,
    segformer_b2,
    segformer_b3,
    segformer_b4,
    segformer_b5,
)
from keras_tfm.models.sentence_embedder import SentenceEmbedder
from keras_tfm.models.siglip import SigLIP, siglip_base_patch16_224, siglip_large_patch16_256, siglip_so400m_patch14_224
from keras_tfm.models.text_tasks import MaskedLM, QuestionAnswerer, SequenceClassifier, TokenClassifier
from keras_tfm.models.translator import Translator, transformer_base, transformer_big, transformer_small
from keras_tfm.models.vit import (
    ViT,
    deit_base_distilled,
    deit_small_distilled,
    deit_tiny_distilled,
    dinov2_base,
    dinov2_giant,
    dinov2_large,
    dinov2_small,
    vit_base,
    vit_huge,
    vit_large,
    vit_small,
    vit_small_images,
    vit_tiny,
)
from keras_tfm.models.vit_mae import ViTMAE, vit_mae_base, vit_mae_huge, vit_mae_large
from keras_tfm.models.yolos import YOLOS, yolos_base, yolos_small, yolos_tiny
