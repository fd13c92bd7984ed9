"""keras_tfm: transformers for Keras 3 that run unchanged on TensorFlow, JAX and PyTorch."""

# backend_logs first: importing it quiets TensorFlow's start-up logging, before Keras imports TensorFlow.
from keras_tfm import backend_logs, layers, losses, viz
from keras_tfm.convert import from_gguf, from_huggingface, from_keras_hub, save_huggingface
from keras_tfm.generation import GenerationConfig
from keras_tfm.losses import MultipleNegativesRankingLoss, TokenCrossEntropy
from keras_tfm.models import (
    GPT,
    Bert,
    BertClassifier,
    BertMLM,
    BertQuestionAnswerer,
    BertTokenClassifier,
    CausalLM,
    DecoderLM,
    ModernBert,
    ModernBertClassifier,
    ModernBertMLM,
    ModernBertQuestionAnswerer,
    ModernBertTokenClassifier,
    SentenceEmbedder,
    Translator,
    ViT,
    bert_base,
    bert_large,
    bert_medium,
    bert_mini,
    bert_small,
    bert_tiny,
    distilbert_base,
    gpt2_large,
    gpt2_medium,
    gpt2_small,
    gpt2_xl,
    gpt_shakespeare_char,
    gpt_shakespeare_char_cpu,
    llama3_2_1b,
    llama3_8b,
    llama_shakespeare_char,
    llama_shakespeare_char_cpu,
    mistral_7b,
    modernbert_base,
    modernbert_large,
    qwen2_5_0_5b,
    qwen3_0_6b,
    roberta_base,
    roberta_large,
    smollm2_135m,
    smollm2_360m,
    transformer_base,
    transformer_big,
    transformer_small,
    vit_base,
    vit_huge,
    vit_large,
    vit_small,
    vit_small_images,
    vit_tiny,
    xlm_roberta_base,
)
from keras_tfm.saving import load, load_model

__version__ = "0.1.0"
