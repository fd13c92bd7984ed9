"""keras_tfm DecoderLM vs transformers' Llama, Mistral, Qwen2 and Qwen3 built from small random
configurations (no network): logits, greedy decoding, checkpoints both ways and peft adapters."""

import copy
import json

import numpy as np
import pytest

import keras_tfm
from keras_tfm.errors import CheckpointError
from tests.checks import to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.numpy")

VOCABULARY = 97
COMMON = dict(
    vocab_size=VOCABULARY,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# Each variant switches on what one family brings, and a RoPE scaling.
VARIANTS = {
    "llama_gqa_llama3_untied": (
        "LlamaForCausalLM",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=False,
            attention_bias=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "mistral_window_mqa_linear": (
        "MistralForCausalLM",
        dict(
            num_key_value_heads=1,
            sliding_window=6,  # shorter than the sequences
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
        ),
    ),
    "qwen2_bias_tied_window_dynamic": (
        "Qwen2ForCausalLM",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,  # the second layer only
            max_position_embeddings=12,  # the sequences are longer: the dynamic base grows
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
        ),
    ),
    "qwen3_qk_norm_head_dim_yarn": (
        "Qwen3ForCausalLM",
        dict(
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16),
        ),
    ),
}


def hf_model(variant: str, initializer_range=0.02):
    class_name, options = VARIANTS[variant]
    model_class = getattr(transformers, class_name)
    torch.manual_seed(0)
    config = model_class.config_class(**{**COMMON, **options, "initializer_range": initializer_range})
    hf = model_class(config).eval()
    with torch.no_grad():  # norms away from 1, so that a weight read into the wrong norm shows
        for name, parameter in hf.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return hf


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_and_parameter_count_match(rng, variant):
    hf = hf_model(variant)
    model = keras_tfm.from_huggingface(hf)
    ids = rng.integers(0, VOCABULARY, size=(2, 20))
    np.testing.assert_allclose(to_numpy(model(ids)), hf_logits(hf, ids), atol=1e-4, rtol=0)
    assert model.count_params() == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("variant", ["llama_gqa_llama3_untied", "mistral_window_mqa_linear"])
def test_greedy_generate_of_ragged_prompts_matches_transformers(rng, variant):
    hf = hf_model(variant, initializer_range=0.3)  # peaked logits: argmax decided by the model, not float noise
    model = keras_tfm.from_huggingface(hf)
    prompts = [rng.integers(1, VOCABULARY, size=9).tolist(), rng.integers(1, VOCABULARY, size=4).tolist()]
    ours, scores = model.generate(prompts, max_new_tokens=10, return_scores=True)
    for row, row_scores, prompt in zip(ours, scores, prompts):
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=10,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
                output_scores=True,
                return_dict_in_generate=True,
            )
        np.testing.assert_array_equal(row[: out.sequences.shape[1]], out.sequences[0].numpy())
        transition = hf.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0].numpy()
        np.testing.assert_allclose(row_scores, transition, atol=1e-4, rtol=0)  # log-probabilities of the tokens


@pytest.mark.backend_independent  # the logits of each variant on every backend: test_logits_and_parameter_count_match
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_save_huggingface_writes_what_transformers_loads(rng, tmp_path, variant):
    model = keras_tfm.from_huggingface(hf_model(variant))
    keras_tfm.save_huggingface(model, str(tmp_path))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(loaded).__name__ == VARIANTS[variant][0]
    ids = rng.integers(0, VOCABULARY, size=(2, 20))
    expected = to_numpy(model(ids))
    np.testing.assert_allclose(hf_logits(loaded, ids), expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(to_numpy(keras_tfm.from_huggingface(str(tmp_path))(ids)), expected, atol=1e-5)


@pytest.mark.backend_independent
def test_sharded_checkpoint_directory_loads(rng, tmp_path):
    hf = hf_model("llama_gqa_llama3_untied")
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ids = rng.integers(0, VOCABULARY, size=(1, 12))
    np.testing.assert_allclose(to_numpy(keras_tfm.from_huggingface(str(tmp_path))(ids)), hf_logits(hf, ids), atol=1e-4)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0])), "rope_type='longrope'"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
        (dict(hidden_act="tanh"), "activation 'tanh'"),
    ],
)
def test_settings_it_does_not_compute_are_refused_by_name(tmp_path, change, message):
    hf_model("llama_gqa_llama3_untied").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        keras_tfm.from_huggingface(str(tmp_path))


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(rope_scaling="linear"), r"the field 'rope_scaling' must be an object; it is 'linear'"),
        (dict(rope_scaling={"rope_type": "linear"}), r"\(rope_scaling\): rope_type 'linear' needs a 'factor'"),
        (dict(eos_token_id="</s>"), r"the field 'eos_token_id' must be a token id .*; it is '</s>'"),
        (dict(num_attention_heads=None), r"lacks the field 'num_attention_heads', which a 'llama' checkpoint needs"),
        (dict(num_attention_heads="4"), r"the field 'num_attention_heads' must be an integer > 0; it is '4'"),
        (
            dict(head_dim=24),
            r"weight 'model.layers.0.self_attn.q_proj.weight' has shape \(48, 48\), .* needs \(96, 48\)",
        ),
        (
            dict(vocab_size=99),
            r"weight 'model.embed_tokens.weight' has shape \(97, 48\), .*vocab_size=99.* needs \(99, 48\)",
        ),
    ],
)
def test_a_config_json_field_of_the_wrong_type_or_size_is_named(tmp_path, change, message):
    """Not a KeyError, TypeError or shape error from deep inside: the file, the field, what was expected."""
    hf_model("llama_gqa_llama3_untied").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config.update({key: value for key, value in change.items() if value is not None})
    for key in [key for key, value in change.items() if value is None]:
        config.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as info:
        keras_tfm.from_huggingface(str(tmp_path))
    assert "config.json" in str(info.value)


@pytest.mark.backend_independent
def test_nan_weights_are_refused_unless_allowed_and_an_in_memory_model_keeps_its_end_ids(rng):
    hf = hf_model("llama_gqa_llama3_untied")
    hf.generation_config.eos_token_id = [5, 7]  # a directory's generation_config.json gives the same
    assert keras_tfm.from_huggingface(hf).generation_config == {"eos_token_id": [5, 7]}
    with torch.no_grad():
        hf.model.layers[1].mlp.up_proj.weight[3, 4] = float("nan")
    with pytest.raises(CheckpointError, match=r"weight 'model.layers.1.mlp.up_proj.weight' holds 1 NaN") as info:
        keras_tfm.from_huggingface(hf)
    assert info.value.argument == "allow_nan"
    assert np.isnan(to_numpy(keras_tfm.from_huggingface(hf, allow_nan=True)(rng.integers(0, 97, (1, 4))))).any()


@pytest.mark.backend_independent
def test_a_checkpoint_whose_tokenizer_outgrows_its_embeddings_is_refused(tmp_path):
    from tests.recipes.helpers import llama_family_checkpoint

    checkpoint, _, _ = llama_family_checkpoint(tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    tokens = keras_tfm.from_huggingface(str(checkpoint)).tokenizer.vocabulary_size
    config["vocab_size"] = tokens - 1
    (checkpoint / "config.json").write_text(json.dumps(config))
    weights = {name: value for name, value in safetensors.load_file(checkpoint / "model.safetensors").items()}
    for name in [name for name in weights if "embed_tokens" in name or "lm_head" in name]:
        weights[name] = weights[name][: tokens - 1]
    safetensors.save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"has {tokens:,} tokens, more than the {tokens - 1:,} embeddings"):
        keras_tfm.from_huggingface(str(checkpoint))


@pytest.mark.backend_independent
def test_a_model_no_transformers_class_computes_is_not_written(tmp_path):
    model = keras_tfm.DecoderLM(
        vocabulary_size=10,
        max_length=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=8,
        sliding_window=4,
        sliding_window_layers=[1],
    )
    with pytest.raises(ValueError, match="sliding window on some layers only"):
        keras_tfm.save_huggingface(model, str(tmp_path))


@pytest.mark.backend_independent
def test_peft_adapter_both_ways(rng, tmp_path):
    peft = pytest.importorskip("peft")
    hf = hf_model("llama_gqa_llama3_untied")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], task_type="CAUSAL_LM")
    tuned = peft.get_peft_model(copy.deepcopy(hf), config).eval()
    with torch.no_grad():
        for name, parameter in tuned.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5)
    ids = rng.integers(0, VOCABULARY, size=(2, 11))
    expected = hf_logits(tuned, ids)
    assert np.abs(expected - hf_logits(hf, ids)).max() > 1e-2
    model = keras_tfm.from_huggingface(tuned)
    np.testing.assert_allclose(to_numpy(model(ids)), expected, atol=1e-4, rtol=0)
    assert model.blocks[0].feed_forward.gate_dense.lora_rank == 4
    hf.save_pretrained(tmp_path / "base")
    keras_tfm.convert.save_peft_adapter(model, str(tmp_path / "adapter"), base=str(tmp_path / "base"))
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(hf), str(tmp_path / "adapter")).eval()
    np.testing.assert_allclose(hf_logits(loaded, ids), expected, atol=1e-4, rtol=0)


@pytest.mark.backend_independent  # generation on every backend: the tests above
def test_a_checkpoint_directory_brings_its_tokenizer_and_generates_transformers_text(tmp_path):
    from keras_tfm.data import HuggingFaceTokenizer
    from tests.recipes.helpers import llama_family_checkpoint

    checkpoint, hf, _ = llama_family_checkpoint(tmp_path, initializer_range=0.5)  # peaked: argmax is the model's
    model = keras_tfm.from_huggingface(str(checkpoint))
    assert isinstance(model.tokenizer, HuggingFaceTokenizer)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    prompts = ["To be, or not", "Good morrow"]
    texts = model.generate(prompts, max_new_tokens=8)
    for prompt, text in zip(prompts, texts):
        encoded = tokenizer(prompt, return_tensors="pt")  # with Llama 3's <|begin_of_text|> in front
        with torch.no_grad():
            ids = hf.generate(**encoded, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert text == tokenizer.decode(ids[0], skip_special_tokens=True)
    assert model.generate(prompts[1], max_new_tokens=8) == texts[1]  # a string gives a string


# Each control alone in one process; combined, in a ragged batch and in beam search, on every backend.
ONCE = pytest.mark.backend_independent


@pytest.mark.parametrize(
    "controls",
    [
        pytest.param(dict(repetition_penalty=3.0), marks=ONCE, id="repetition"),
        pytest.param(dict(no_repeat_ngram_size=2), marks=ONCE, id="no_repeat_ngram"),
        pytest.param(dict(min_new_tokens=6, stop_first_greedy_token=True), marks=ONCE, id="min_new_tokens"),
        pytest.param(dict(num_beams=2, no_repeat_ngram_size=3), marks=ONCE, id="beams_ngram"),
        pytest.param(
            dict(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=3, stop_first_greedy_token=True),
            marks=ONCE,
            id="greedy_with_controls",
        ),
        pytest.param(
            dict(
                num_beams=3,
                num_return_sequences=2,
                repetition_penalty=1.5,
                no_repeat_ngram_size=3,
                min_new_tokens=3,
                stop_first_greedy_token=True,
            ),
            id="beams_with_controls",
        ),
    ],
)
def test_generation_controls_give_transformers_tokens(rng, controls):
    hf = hf_model("llama_gqa_llama3_untied", initializer_range=0.3)
    model = keras_tfm.from_huggingface(hf)
    for _ in range(30):  # a prompt whose greedy continuation repeats a pair of tokens: where the controls matter
        prompt = rng.integers(1, VOCABULARY, size=(1, 6))
        plain = model.generate(prompt, max_new_tokens=8)[0].tolist()
        pairs = list(zip(plain, plain[1:]))
        if len(set(pairs)) < len(pairs):
            break
    controls = dict(controls)
    stop = []
    if controls.pop("stop_first_greedy_token", False):  # a stop token greedy decoding would emit at once
        stop = [int(model.generate(prompt, max_new_tokens=1)[0, -1])]
    ours = model.generate(prompt, max_new_tokens=8, stop_token_ids=stop, **controls)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompt),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=stop or None,
            early_stopping=False,
            **controls,
        ).numpy()
    assert ours.shape[0] == expected.shape[0] == controls.get("num_return_sequences", 1)
    np.testing.assert_array_equal(ours[:, : expected.shape[1]], expected)
    assert np.all(ours[:, expected.shape[1] :] == 0)  # rows that stopped early are padded
    if (
        controls.get("no_repeat_ngram_size") == 2 and "num_beams" not in controls
    ):  # no pair twice, and it changed something
        pairs = list(zip(ours[0].tolist(), ours[0, 1:].tolist()))
        assert len(set(pairs)) == len(pairs) and ours[0].tolist() != plain
    if "repetition_penalty" in controls:  # and it changed something
        plain = model.generate(prompt, max_new_tokens=8, stop_token_ids=stop, num_beams=controls.get("num_beams", 1))
        assert not np.array_equal(plain, ours[:1])
    if "min_new_tokens" in controls:  # the stop token came no earlier than allowed
        new = ours[0, 6:]
        assert stop[0] not in new[: controls["min_new_tokens"]].tolist()


def test_controls_read_each_rows_own_tokens_in_a_ragged_batch(rng):
    """Rows of different lengths decode at their own positions: each row's n-gram ban, repetition penalty and
    minimum read its own tokens, and each row gives what transformers gives its prompt alone."""
    hf = hf_model("llama_gqa_llama3_untied", initializer_range=0.3)
    model = keras_tfm.from_huggingface(hf)
    prompts = [rng.integers(1, VOCABULARY, size=n).tolist() for n in (9, 4, 6)]
    stop = int(model.generate([prompts[1]], max_new_tokens=1)[0, -1])  # the second row would stop at once
    controls = dict(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=3)
    ours = model.generate(prompts, max_new_tokens=8, stop_token_ids=[stop], **controls)
    assert not np.array_equal(ours, model.generate(prompts, max_new_tokens=8, stop_token_ids=[stop]))
    for row, prompt in zip(ours, prompts):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0,
                                   eos_token_id=stop, **controls)[0].numpy()  # fmt: skip
        np.testing.assert_array_equal(row[: len(expected)], expected)
        assert (row[len(expected) :] == 0).all()


@pytest.mark.backend_independent  # greedy scores on every backend: the ragged test above
def test_sampled_scores_are_the_log_probabilities_of_the_warped_distribution(rng):
    model = keras_tfm.from_huggingface(hf_model("llama_gqa_llama3_untied", initializer_range=0.3))
    prompt = rng.integers(1, VOCABULARY, size=(1, 5))
    ids, scores = model.generate(prompt, max_new_tokens=6, temperature=0.7, top_k=5, seed=3, return_scores=True)
    logits = to_numpy(model(ids[:, :-1]))[0, 4:] / 0.7  # the positions that chose the 6 new tokens
    kth = np.sort(logits, axis=-1)[:, -5][:, None]
    warped = np.where(logits < kth, -np.inf, logits)
    log_probabilities = (
        warped
        - np.log(np.sum(np.exp(warped - warped.max(-1, keepdims=True)), -1, keepdims=True))
        - warped.max(-1, keepdims=True)
    )
    expected = log_probabilities[np.arange(6), ids[0, 5:]]
    np.testing.assert_allclose(scores[0], expected, atol=1e-4, rtol=0)
    assert np.all(scores < 0) and np.all(np.isfinite(scores))
    texts_or_ids = model.generate(prompt, max_new_tokens=6, temperature=0.7, top_k=5, seed=3)
    np.testing.assert_array_equal(texts_or_ids, ids)  # asking for scores changes no token
    with pytest.raises(ValueError, match="return_scores"):
        model.generate(prompt, max_new_tokens=2, num_beams=2, return_scores=True)


@pytest.mark.backend_independent
def test_bad_generation_controls_are_refused_by_name():
    model = keras_tfm.from_huggingface(hf_model("llama_gqa_llama3_untied"))
    for kwargs, message in [
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(min_new_tokens=-1), "min_new_tokens"),
        (dict(no_repeat_ngram_size=1.5), "no_repeat_ngram_size"),
        (dict(num_return_sequences=2), "^num_return_sequences: .*greedy decoding has one"),
        (dict(num_beams=2, num_return_sequences=3), "^num_return_sequences: .*at most its `num_beams`=2"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.generate([[1, 2]], max_new_tokens=2, **kwargs)


# ChatML, as Qwen's checkpoints write it, with a default system message, the bos token and a refusal.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{% endif %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MESSAGES = [
    {"role": "user", "content": "To be, or not to be?"},
    {"role": "assistant", "content": "That is the question."},
    {"role": "user", "content": "Whether 'tis nobler…"},
]


def _transformers_ids(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.backend_independent  # the template and the stop ids; generation on every backend: the tests above
def test_chat_renders_as_transformers_and_stops_at_the_checkpoints_end_ids(tmp_path):
    from tests.recipes.helpers import llama_family_checkpoint

    checkpoint, _, _ = llama_family_checkpoint(tmp_path, initializer_range=0.5)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))  # room to talk
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint))
    theirs = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    model = keras_tfm.from_huggingface(str(checkpoint))
    text = model.tokenizer.apply_chat_template(MESSAGES)
    assert text == theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|><|im_start|>system\nBe brief.") and text.endswith("assistant\n")
    prompt = model.tokenizer.encode(text).tolist()
    assert prompt == _transformers_ids(theirs, MESSAGES)

    def transformers_reply(hf_model, **settings):
        with torch.no_grad():
            ids = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, **settings)
        return theirs.decode(ids[0, len(prompt) :], skip_special_tokens=True), ids[0, len(prompt) :].tolist()

    reply = model.chat(MESSAGES, max_new_tokens=8, stop_token_ids=())
    expected, new_ids = transformers_reply(hf, eos_token_id=None, pad_token_id=0)
    assert reply == expected
    # The checkpoint's generation_config.json names two end ids: the third new token and another; both
    # libraries stop at the first that comes.
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [new_ids[2], 0], "pad_token_id": 0}))
    model = keras_tfm.from_huggingface(str(checkpoint))
    assert model.generation_config == {"eos_token_id": [new_ids[2], 0], "pad_token_id": 0}
    short = model.chat(MESSAGES, max_new_tokens=8)
    assert short == transformers_reply(transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)))[0]
    assert len(short) < len(reply)
    model.save(tmp_path / "chat.keras")  # the template and the end ids travel with the model
    loaded = keras_tfm.load_model(tmp_path / "chat.keras")
    assert loaded.tokenizer.chat_template == CHAT_TEMPLATE and loaded.generation_config == model.generation_config
    assert loaded.chat(MESSAGES, max_new_tokens=8) == short
    keras_tfm.save_huggingface(loaded, tmp_path / "back")  # the tokenizer, template and end ids go with it
    again = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
    assert again.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == text
    assert transformers.GenerationConfig.from_pretrained(str(tmp_path / "back")).eos_token_id == [new_ids[2], 0]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "messages must be a non-empty list"),
        ("Hello", "messages must be a non-empty list"),
        ([{"role": "user"}], r"messages\[0\] must be a dict with a 'role' and a 'content'"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], r"messages\[1\] must be a dict"),
        ([{"role": 3, "content": "a"}], r"messages\[0\] needs a string 'role'"),
        ([{"role": "tool", "content": "a"}], "the chat template refused the messages: Unknown role: tool"),
    ],
)
def test_bad_chat_messages_are_refused_by_name(messages, message):
    import tokenizers

    from keras_tfm.data import HuggingFaceTokenizer
    from keras_tfm.errors import InputError

    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer = HuggingFaceTokenizer(words.to_str(), chat_template=CHAT_TEMPLATE, special_tokens={"bos_token": "[UNK]"})
    model = keras_tfm.DecoderLM(
        vocabulary_size=2, max_length=64, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
    )
    model.tokenizer = tokenizer
    with pytest.raises(InputError, match=message) as error:
        model.chat(messages)
    assert error.value.argument == "messages"
    model.tokenizer = None
    with pytest.raises(InputError, match="needs a tokenizer with a chat template"):
        model.chat([{"role": "user", "content": "a"}])
