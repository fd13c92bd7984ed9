"""BERT's named sizes (and RoBERTa's, XLM-RoBERTa's, DistilBERT's): one line of configuration each over
`Bert` and its heads."""

from __future__ import annotations

import keras

from keras_tfm.errors import InputError
from keras_tfm.models.bert import Bert, BertClassifier, BertMLM, BertQuestionAnswerer, BertTokenClassifier

_HEADS = {"mlm": BertMLM, "classifier": BertClassifier, None: Bert}


def _bert(defaults: dict, head: str | None, overrides: dict) -> keras.Model:
    heads = {**_HEADS, "token_classifier": BertTokenClassifier, "question_answerer": BertQuestionAnswerer}
    if head not in heads:
        raise InputError(f"head must be 'mlm', 'classifier', 'token_classifier', 'question_answerer' or None; "
                         f"received {head!r}.", caller="BERT")  # fmt: skip
    arguments = {**defaults, **overrides}
    if head != "classifier":
        arguments.pop("pooler_activation", None)  # DistilBERT's, for its classifier
    return heads[head](**arguments)


def bert_tiny(head: str | None = "mlm", **overrides) -> keras.Model:
    """BERT-Tiny: 2 layers, 2 heads, 128 wide. `head`: "mlm" (BertMLM), "classifier", "token_classifier",
    "question_answerer", or None (encoder)."""
    return _bert(dict(num_layers=2, num_heads=2, hidden_dim=128), head, overrides)


def bert_mini(head: str | None = "mlm", **overrides) -> keras.Model:
    """BERT-Mini: 4 layers, 4 heads, 256 wide."""
    return _bert(dict(num_layers=4, num_heads=4, hidden_dim=256), head, overrides)


def bert_small(head: str | None = "mlm", **overrides) -> keras.Model:
    """BERT-Small: 4 layers, 8 heads, 512 wide."""
    return _bert(dict(num_layers=4, num_heads=8, hidden_dim=512), head, overrides)


def bert_medium(head: str | None = "mlm", **overrides) -> keras.Model:
    """BERT-Medium: 8 layers, 8 heads, 512 wide."""
    return _bert(dict(num_layers=8, num_heads=8, hidden_dim=512), head, overrides)


def bert_base(head: str | None = "mlm", **overrides) -> keras.Model:
    """BERT-Base: 12 layers, 12 heads, 768 wide (110M)."""
    return _bert(dict(num_layers=12, num_heads=12, hidden_dim=768), head, overrides)


def bert_large(head: str | None = "mlm", **overrides) -> keras.Model:
    """BERT-Large: 24 layers, 16 heads, 1024 wide (340M)."""
    return _bert(dict(num_layers=24, num_heads=16, hidden_dim=1024), head, overrides)


def roberta_base(head: str | None = "mlm", **overrides) -> keras.Model:
    """RoBERTa-Base: BERT-Base's encoder, positions from 2 (125M as `RobertaForMaskedLM`); `head` as BERT's."""
    return _bert(ROBERTA | dict(num_layers=12, num_heads=12, hidden_dim=768), head, overrides)


def roberta_large(head: str | None = "mlm", **overrides) -> keras.Model:
    """RoBERTa-Large: 24 layers, 16 heads, 1024 wide (355M)."""
    return _bert(ROBERTA | dict(num_layers=24, num_heads=16, hidden_dim=1024), head, overrides)


def xlm_roberta_base(head: str | None = "mlm", **overrides) -> keras.Model:
    """XLM-RoBERTa-Base: RoBERTa-Base over a 250,002-token multilingual vocabulary (278M)."""
    return _bert(ROBERTA | dict(vocabulary_size=250002, num_layers=12, num_heads=12, hidden_dim=768), head, overrides)


def distilbert_base(head: str | None = "mlm", **overrides) -> keras.Model:
    """DistilBERT-Base: 6 layers, 12 heads, 768 wide, no segments (66M as `DistilBertForMaskedLM`)."""
    distilled = dict(num_segments=0, num_layers=6, num_heads=12, hidden_dim=768, pooler_activation="relu")
    return _bert(distilled, head, overrides)


# RoBERTa's published configuration: its own vocabulary, positions 2 ... 513, one segment
ROBERTA = dict(vocabulary_size=50265, max_length=514, num_segments=1, position_offset=2, layer_norm_epsilon=1e-5)
