"""`generate(..., json_schema=...)`: whatever the weights, every continuation is JSON that follows the
schema; what constrained decoding cannot hold is refused by name. The grammar's side is the host's; the
row loop's compiled chunk with a host bias is tested on every backend in `test_continuous`."""

import json

import keras
import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import InputError
from tests.checks import chat_model, to_numpy

pytest.importorskip("llguidance")

CHARACTERS = ' abcdefghijklmnopqrstuvwxyz{}[]":,0123456789.-<>_/\n'
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}


def json_model(chat_template: str = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}", max_length: int = 128):
    """A one-layer model of random weights whose one-character vocabulary can write JSON."""
    import tokenizers

    from keras_tfm.data import HuggingFaceTokenizer

    vocabulary = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({c: i for i, c in enumerate(CHARACTERS)}, unk_token=" ")
    )
    vocabulary.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("[\\s\\S]"), behavior="isolated")
    vocabulary.decoder = tokenizers.decoders.Fuse()
    model = keras_tfm.DecoderLM(
        vocabulary_size=len(CHARACTERS),
        max_length=max_length,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
    )
    model.tokenizer = HuggingFaceTokenizer(vocabulary.to_str(), chat_template=chat_template)
    return model


@pytest.mark.backend_independent
def test_every_continuation_follows_the_schema_whatever_the_weights():
    model = json_model()
    prompts = ["to be", "speak up and"]
    texts = model.generate(prompts, max_new_tokens=60, json_schema=SCHEMA, temperature=1.5, seed=2,
                           num_return_sequences=2, frequency_penalty=0.5)  # fmt: skip
    replies = [text[len(prompt) :] for prompt, pair in zip(prompts, texts) for text in pair]
    for reply in replies:  # no stop token here: each ends with its grammar, not in the buffer's padding
        value = json.loads(reply)
        assert reply == json.dumps(value, separators=(",", ":"), ensure_ascii=False), reply
        assert set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool), reply
        assert isinstance(value["city"], str) and len(value["city"]) <= 6, reply
    assert len(set(replies)) > 1  # sampled: the grammar chose nothing for them
    again = model.generate(prompts, max_new_tokens=60, json_schema=SCHEMA, temperature=1.5, seed=2,
                           num_return_sequences=2, frequency_penalty=0.5)  # fmt: skip
    assert again == texts  # seeded
    ids = model.generate([[1, 2, 3]], max_new_tokens=40, json_schema=True)  # any object, greedy, ids in and out
    assert isinstance(json.loads(model.decode_text(ids[0, 3:])), dict)


@pytest.mark.backend_independent
def test_min_new_tokens_never_holds_a_row_past_its_grammars_end():
    """A minimum past the JSON's length, with an end token the grammar allows after the JSON: the row ends with its
    grammar, as without a minimum (the end token is forbidden only while the grammar allows something else)."""
    model = json_model()
    model.generation_config = {"eos_token_id": CHARACTERS.index("\n")}
    replies = [model.generate("to be", max_new_tokens=60, json_schema=SCHEMA, temperature=1.0, seed=3,
                              min_new_tokens=minimum)[len("to be") :] for minimum in (0, 50)]  # fmt: skip
    assert replies[0] == replies[1] and set(json.loads(replies[1])) == {"city", "sunny"}


@pytest.mark.backend_independent
def test_an_ngram_ban_gives_way_only_where_it_leaves_the_grammar_no_token():
    """With `no_repeat_ngram_size=2`, each greedy step takes the likeliest token the grammar allows that repeats
    no pair of the text so far, or, where every token the grammar allows would (JSON's `":` after each key), the
    likeliest it allows: what full forward passes on the host choose by that rule."""
    from keras_tfm.generation.grammar import Constraint, schema_grammar

    model = json_model()
    reply = model.generate("to be", max_new_tokens=40, json_schema=SCHEMA, no_repeat_ngram_size=2, temperature=0)
    ids, constraint = model.tokenizer.encode("to be").tolist(), Constraint(model, schema_grammar(SCHEMA))
    given_way = 0
    for _ in range(40):
        logits = to_numpy(model(np.array([ids], "int32")))[0, -1]
        allowed = constraint.bias() == 0
        kept = allowed.copy()
        kept[[after for before, after in zip(ids, ids[1:]) if before == ids[-1]]] = False
        given_way += not kept.any()
        ids.append(int(np.argmax(np.where(kept if kept.any() else allowed, logits, -np.inf))))
        if constraint.take(ids[-1]):
            break
    assert reply == model.tokenizer.decode(np.array(ids)) and given_way > 0, (reply, given_way)
    assert set(json.loads(reply[len("to be") :])) == {"city", "sunny"}


@pytest.mark.backend_independent
def test_what_constrained_decoding_cannot_hold_is_refused():
    model = json_model()
    for settings, argument in (
        (dict(num_beams=2), "json_schema"),
        (dict(return_scores=True), "return_scores"),
        (dict(json_schema="{not json"), "json_schema"),
    ):
        with pytest.raises(InputError, match=rf"^{argument}: "):
            model.generate("to be", max_new_tokens=4, **{"json_schema": SCHEMA, **settings})
    with pytest.raises(InputError, match=r"^json_schema: no token of the model's vocabulary begins a reply"):
        chat_model(max_length=32).generate("ab", max_new_tokens=4, json_schema=True)  # no "{" in its vocabulary
    with pytest.raises(InputError, match=r"^json_schema: DecoderLM\.stream: is taken by `generate`"):
        next(iter(model.stream("to be", max_new_tokens=4, json_schema=SCHEMA)))


def byte_level_model(vocabulary_size: int = 4000):
    """A one-layer model of random weights over a byte-level BPE (GPT-2's and SmolLM2's kind of tokenizer:
    pieces of many characters, a byte table) learned on Shakespeare's text."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from keras_tfm.data import HuggingFaceTokenizer
    from tests.recipes.helpers import SHAKESPEARE

    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()[:200_000]
    words = tokenizers.Tokenizer(models.BPE())
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocabulary_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    words.train_from_iterator([text], trainer)
    keras.utils.set_random_seed(0)  # the same weights each time: the seeds below meet the top of the noise
    model = keras_tfm.DecoderLM(vocabulary_size=words.get_vocab_size(), max_length=96, num_layers=1, num_heads=2,
                                hidden_dim=8, intermediate_dim=16)  # fmt: skip
    model.tokenizer = HuggingFaceTokenizer(words.to_str())
    return model


@pytest.mark.backend_independent
def test_sampled_rows_of_a_byte_level_tokenizer_never_leave_the_grammar():
    """48 rows, each sampled among thousands of multi-character pieces, three seeds whose noise reaches the
    top of its range at some step (where a masked piece would win an unbounded draw): every reply that
    ends parses and follows the schema."""
    model = byte_level_model()
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "t": {"type": "number"}}, "required": ["city", "t"]}
    whole = 0
    for seed in (7, 12, 19):
        texts = model.generate(["to be", "speak"], max_new_tokens=80, json_schema=schema, temperature=1.0, seed=seed,
                               min_p=0.05, num_return_sequences=8)  # fmt: skip
        for prompt, replies in zip(["to be", "speak"], texts):
            for text in replies:
                reply = text[len(prompt) :]
                if not reply.endswith("}"):  # cut at max_new_tokens: a valid beginning
                    assert reply.startswith('{"'), reply
                    continue
                value = json.loads(reply)
                assert {"city", "t"} <= set(value) <= {"city", "sunny", "t"} and len(value["city"]) <= 6, text
                whole += 1
    assert whole >= 24  # of 48
