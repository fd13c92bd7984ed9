"""The token heads' answers for people against transformers on the same checkpoints: word labels (its
token-classification pipeline) and answer spans (its tokenizer's windows, its model and the span search of its
question-answering pipeline; a context longer than the model)."""

import os

import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import bert_vocabulary

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = "George Washington visited the old harbour of Boston, then sailed north to Halifax in 1783."
QUESTION = "Where did George Washington sail to?"


def checkpoint(directory, name: str) -> str:
    """A random transformers checkpoint of `name` with a fast WordPiece tokenizer (tokenizer.json)."""
    os.makedirs(directory, exist_ok=True)
    vocabulary = os.path.join(directory, "vocab.txt")
    with open(vocabulary, "w") as file:
        file.write("\n".join(bert_vocabulary(TEXT + " " + QUESTION)) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocabulary)
    sizes = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    if name.startswith("ModernBert"):  # global, then local attention over 4 tokens on each side
        special = dict(pad_token_id=0, bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
        config = transformers.ModernBertConfig(**sizes, **special, local_attention=8, global_attn_every_n_layers=2)
    else:
        config = transformers.BertConfig(**sizes)
    if name == "BertForTokenClassification":
        config.id2label = {0: "B-PER", 1: "B-LOC", 2: "B-DATE"}  # each word its own entity to the pipeline
    torch.manual_seed(0)
    getattr(transformers, name)(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_word_labels_are_the_pipelines_at_each_words_first_piece(tmp_path):
    directory = checkpoint(tmp_path, "BertForTokenClassification")
    tagger = keras_tfm.from_huggingface(directory)
    words = tagger.label_words(TEXT)
    pipeline = transformers.pipeline("token-classification", model=directory, device="cpu")
    first_pieces = [token for token in pipeline(TEXT) if not token["word"].startswith("##")]
    assert [word["word"] for word in words][:4] == ["George", "Washington", "visited", "the"]
    assert [(w["label"], w["start"]) for w in words] == [(t["entity"], t["start"]) for t in first_pieces]
    np.testing.assert_allclose([w["score"] for w in words], [t["score"] for t in first_pieces], atol=1e-5)
    assert all(TEXT[w["start"] : w["end"]] == w["word"] for w in words)
    assert tagger.label_words([TEXT, "Boston"])[1][0]["word"] == "Boston"
    long = " ".join([TEXT] * 12)  # 216 words, 7x the model's 32 tokens: read in windows, every word labelled
    pieces = pipeline.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(long)
    labelled = tagger.label_words(long, stride=8)
    assert [(w["word"], (w["start"], w["end"])) for w in labelled] == pieces
    assert {w["label"] for w in labelled} <= {"B-PER", "B-LOC", "B-DATE"}
    with pytest.raises(ValueError, match=r"stride: label_words: expected an integer in \[0, 16\)"):
        tagger.label_words(long, stride=16)
    unknown = "Georgia visited Bostonia then sailed northward"  # words not in the vocabulary: a piece per letter
    scores = {}
    for aggregation in ("first", "average", "max"):
        ours = tagger.label_words(unknown, aggregation=aggregation)
        theirs = pipeline(unknown, aggregation_strategy=aggregation)
        assert [(w["label"], w["start"], w["end"]) for w in ours] == [
            ("B-" + t["entity_group"], t["start"], t["end"]) for t in theirs
        ]
        scores[aggregation] = [w["score"] for w in ours]
        np.testing.assert_allclose(scores[aggregation], [t["score"] for t in theirs], atol=1e-5)
    assert scores["average"] != scores["first"] and scores["max"] != scores["first"]
    with pytest.raises(
        ValueError, match=r"aggregation: label_words: expected one of first, average, max; received 'simple'"
    ):
        tagger.label_words(TEXT, aggregation="simple")


def reference_answer(directory: str, question: str, context: str, max_length: int, stride: int, longest: int):
    """transformers' tokenizer and model, and the span search of its question-answering pipeline (removed in
    transformers 5) written out: each window's softmax over the context and [CLS], [CLS] then zeroed, the
    best start x end product over spans of at most `longest` tokens, the best window's span."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(directory).eval()
    segments = model.config.model_type == "bert"  # ModernBERT has none
    windows = tokenizer(question, context, truncation="only_second", max_length=max_length, stride=stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)  # fmt: skip
    best = (0.0, None)
    for index, ids in enumerate(windows["input_ids"]):
        context_tokens = [part == 1 for part in windows.sequence_ids(index)]
        with torch.no_grad():
            types = {"token_type_ids": torch.tensor([windows["token_type_ids"][index]])} if segments else {}
            out = model(torch.tensor([ids]), **types)
        probabilities = []
        for logits in (out.start_logits[0].numpy(), out.end_logits[0].numpy()):
            kept = np.array(
                [
                    logit if inside or i == 0 else -10000.0
                    for i, (logit, inside) in enumerate(zip(logits, context_tokens))
                ]
            )
            p = np.exp(kept - kept.max()) / np.exp(kept - kept.max()).sum()
            p[0] = 0.0
            probabilities.append(p)
        for i in range(len(ids)):
            for j in range(i, min(i + longest, len(ids))):
                score = probabilities[0][i] * probabilities[1][j]
                if context_tokens[i] and context_tokens[j] and score > best[0]:
                    offsets = windows["offset_mapping"][index]
                    best = (score, (offsets[i][0], offsets[j][1]))
    score, (start, end) = best
    return {"answer": context[start:end], "score": score, "start": start, "end": end}


@pytest.mark.parametrize("name", ["BertForQuestionAnswering", "ModernBertForQuestionAnswering"])
def test_answers_are_the_pipelines_over_windows_of_a_long_context(tmp_path, name):
    directory = checkpoint(tmp_path, name)
    reader = keras_tfm.from_huggingface(directory)
    context = " ".join([TEXT] * 3)  # about 70 tokens: windows of 32 sharing 8
    ours = reader.answer(QUESTION, context, max_length=32, stride=8, max_answer_length=15)
    expected = reference_answer(directory, QUESTION, context, 32, 8, 15)
    assert (ours["answer"], ours["start"], ours["end"]) == (expected["answer"], expected["start"], expected["end"])
    assert ours["score"] == pytest.approx(expected["score"], rel=1e-4) and ours["answer"]
    with pytest.raises(InputError, match=r"question: answer: expected a question and a context"):
        reader.answer("", context)
    for bad in (dict(max_answer_length="15"), dict(max_length=2), dict(stride=-1), dict(stride=2.5)):
        with pytest.raises(InputError, match=rf"^{next(iter(bad))}: answer: expected an integer >= "):
            reader.answer(QUESTION, context, **bad)
