"""The GPT recipe: a short run and what it leaves, the model written for transformers, fine-tuning a checkpoint (and LoRA), the model's tokenizer."""

from __future__ import annotations

import json
import re

import keras
import numpy as np
import pytest

from keras_tfm.errors import DataError
from keras_tfm.training import TrainingConfig, train
from tests.recipes.helpers import (
    BACKEND,
    SHAKESPEARE,
    TINY_GPT,
    gpt2_checkpoint,
    llama_family_checkpoint,
    recipe,
    recipe_args,
    recipe_function,
    saved_weight,
    short_fine_tuning,
)


def test_gpt_recipe_short_run_leaves_checkpoint_metrics_and_plots(tmp_path):
    out = tmp_path / "run"
    done = recipe(
        "gpt_lm.py",
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--output-dir",
        str(out),
        "--precision",
        "mixed_bfloat16",
        "--tokenizer",
        "bpe",
        "--vocabulary-size",
        "300",
        "--remat",
        "--tensorboard",
        *TINY_GPT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "offline default" in done.stdout and "blocks rematerialized" in done.stdout
    )  # no --data: the bundled text, announced
    assert done.stdout.startswith(f"Output in {out} (checkpoints,")  # where it goes: the first line
    # the whole run's progress after each epoch's own line: steps, time, and an estimate while some are left
    assert re.search(r"val_loss: [0-9.]+\nstep 2/4 \(50%\), [0-9]+ s elapsed, about [0-9]+ s left\n", done.stdout)
    assert re.search(r"val_loss: [0-9.]+\nstep 4/4 \(100%\), [0-9]+ s elapsed\n", done.stdout)
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["epoch"] == 2 and (out / "checkpoint" / state["weights"]).stat().st_size > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["backend"] == BACKEND and metrics["steps"] == 4 and metrics["precision"] == "mixed_bfloat16"
    assert metrics["remat"] is True
    assert metrics["tokenizer"] == "bpe" and metrics["vocabulary_size"] == 300
    assert 2.0 < metrics["validation_loss"] < 6.0
    assert np.isclose(metrics["validation_perplexity"], np.exp(metrics["validation_loss"]), rtol=1e-4)
    assert (out / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert len((out / "log.csv").read_text().splitlines()) == 3  # header + 2 epochs
    assert (out / "samples.txt").read_text()
    assert list((out / "tensorboard" / "train").glob("events.out.tfevents.*"))  # on every backend


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_character_level_gpt_recipe_is_written_for_transformers(tmp_path):
    """The default, character-level GPT run leaves a checkpoint that transformers' text-generation
    pipeline uses as is: its tokenizer's ids and its greedy text are the run's own."""
    transformers = pytest.importorskip("transformers")
    import keras_tfm
    from keras_tfm.data import load_tokenizer

    out = tmp_path / "run"
    done = recipe(
        "gpt_lm.py",
        "--data",
        SHAKESPEARE,
        "--steps",
        "2",
        "--steps-per-epoch",
        "2",
        "--sample-every",
        "0",
        "--output-dir",
        str(out),
        *TINY_GPT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "metrics.json").read_text())["huggingface_checkpoint"] == str(out / "huggingface")
    hf, loading = transformers.AutoModelForCausalLM.from_pretrained(out / "huggingface", output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    embeddings = hf.state_dict()["transformer.wte.weight"].numpy()
    np.testing.assert_array_equal(embeddings, saved_weight(out / "checkpoint", embeddings.shape))
    ours = load_tokenizer(str(out / "tokenizer.json"))
    prompt = "ROMEO:\nWhat say'st thou?"
    generated = transformers.pipeline("text-generation", str(out / "huggingface"))(
        prompt, max_new_tokens=8, do_sample=False
    )[0]["generated_text"]
    ids = keras_tfm.from_huggingface(str(out / "huggingface")).generate(ours.encode(prompt)[None], max_new_tokens=8)
    assert generated == ours.decode(np.asarray(ids)[0]) and len(generated) == len(prompt) + 8


# The recipe's pipeline, the same on every backend; each backend's training is the model tests'.
@pytest.mark.backend_independent
def test_gpt_recipe_fine_tunes_a_hugging_face_checkpoint(tmp_path):
    """--from-huggingface: the checkpoint's weights and its byte-pair tokenizer, windows of --max-length."""
    checkpoint, hf = gpt2_checkpoint(tmp_path)
    checkpoint_settings = recipe_function("gpt_lm.py", "checkpoint_settings")
    flags = dict(model="gpt_shakespeare_char_cpu", tokenizer="char", vocabulary_size=8192)
    with pytest.raises(DataError, match="^max_length: the checkpoint has 64 positions; got 65"):
        checkpoint_settings(recipe_args(from_huggingface=str(checkpoint), **{**flags, "max_length": 65}))
    small = tmp_path / "small_vocabulary"
    small.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (small / name).write_text((checkpoint / name).read_text())
    (small / "config.json").write_text(
        json.dumps({**json.loads((checkpoint / "config.json").read_text()), "vocab_size": 300})
    )
    with pytest.raises(DataError, match="the tokenizer has 400 tokens, more than the checkpoint's 300 embeddings"):
        checkpoint_settings(recipe_args(from_huggingface=str(small), **flags))

    out = tmp_path / "run"
    # Learning rate 0: the weights stay the checkpoint's, to be compared below.
    done = recipe("gpt_lm.py", *short_fine_tuning(checkpoint, tmp_path, out), "--learning-rate", "0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{sum(p.numel() for p in hf.parameters()):,} parameters" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == f"from_huggingface {checkpoint}" and metrics["vocabulary_size"] == 400
    assert 4.0 < metrics["validation_loss"] < 8.0  # random weights over 400 tokens: about log(400) = 6.0
    assert (out / "samples.txt").read_text()
    embeddings = hf.state_dict()["transformer.wte.weight"].numpy()
    np.testing.assert_allclose(saved_weight(out / "checkpoint", embeddings.shape), embeddings, atol=1e-6, rtol=0)
    # the fine-tuned model as a Hugging Face checkpoint, with the checkpoint's tokenizer files
    import transformers

    assert metrics["huggingface_checkpoint"] == str(out / "huggingface")
    exported = transformers.GPT2LMHeadModel.from_pretrained(out / "huggingface").state_dict()
    assert set(exported) == set(hf.state_dict())
    np.testing.assert_array_equal(
        exported["transformer.wte.weight"].numpy(), saved_weight(out / "checkpoint", embeddings.shape)
    )
    vocabulary = transformers.GPT2Tokenizer.from_pretrained(out / "huggingface").get_vocab()
    vocabulary.pop("<|endoftext|>")  # GPT2Tokenizer adds it
    assert vocabulary == json.loads((checkpoint / "vocab.json").read_text())


@pytest.mark.backend_independent  # the recipe's pipeline; LoRA's training and resume on each backend: test_lora, test_peft
def test_gpt_recipe_lora_fine_tunes_a_hugging_face_checkpoint_and_resumes(tmp_path):
    """--lora-rank: the checkpoint's weights stay as they were; only the pairs train, and a rerun with more
    steps resumes them."""
    checkpoint, hf = gpt2_checkpoint(tmp_path)
    out = tmp_path / "run"
    flags = [
        "--from-huggingface",
        str(checkpoint),
        "--data",
        str(tmp_path / "text.txt"),
        "--max-length",
        "32",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "8",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "8",
        "--sample-every",
        "0",
        "--learning-rate",
        "1e-2",
        "--lora-rank",
        "4",
        "--verbose",
        "2",
        "--output-dir",
        str(out),
    ]
    done = recipe("gpt_lm.py", *flags, "--steps", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trained = 2 * (32 * 4 + 4 * 32)  # query and value of the one block
    assert (
        f"{sum(p.numel() for p in hf.parameters()) + trained:,} parameters ({trained:,} trained: LoRA rank 4)"
        in done.stdout
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lora_rank"] == 4 and metrics["trainable_parameters"] == trained
    resumed = recipe("gpt_lm.py", *flags, "--steps", "2")  # exact resumption: test_a_lora_checkpoint_resumes_exactly
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "Training already finished in this output directory" in resumed.stdout
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["epoch"] == 1 and (out / "checkpoint" / state["lora"]).exists()
    embeddings = hf.state_dict()["transformer.wte.weight"].numpy()  # frozen, though the learning rate is not 0
    np.testing.assert_allclose(saved_weight(out / "checkpoint", embeddings.shape), embeddings, atol=1e-6, rtol=0)
    with np.load(out / "checkpoint" / state["lora"]) as pairs:
        assert np.abs(pairs["block_0/self_attention/query:b"]).max() > 0  # trained from zero

    # The run wrote its pairs as a peft adapter on the checkpoint (query and value: one c_attn pair of rank 8),
    # which a new run takes as --from-huggingface and trains on.
    assert metrics["peft_adapter"] == str(out / "peft_adapter")
    adapter = json.loads((out / "peft_adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["base_model_name_or_path"], adapter["target_modules"]) == (
        8,
        str(checkpoint),
        ["transformer.h.0.attn.c_attn"],
    )
    peft = pytest.importorskip("peft")
    import torch

    import keras_tfm

    ids = np.arange(12).reshape(2, 6)
    tuned = peft.PeftModel.from_pretrained(hf, out / "peft_adapter").eval()
    with torch.no_grad():
        expected = tuned(torch.tensor(ids)).logits.numpy()
    ours = keras_tfm.from_huggingface(str(out / "peft_adapter"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(ids)), expected, atol=1e-4, rtol=0)
    again = recipe(
        "gpt_lm.py",
        *[flag for flag in flags[2:] if flag not in ("--lora-rank", "4")],
        "--steps",
        "2",
        "--from-huggingface",
        str(out / "peft_adapter"),
        "--output-dir",
        str(tmp_path / "again"),
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trained = 3 * (32 * 8 + 8 * 32)  # query, key and value, each with c_attn's A and its third of B
    assert f"({trained:,} trained: LoRA rank 8)" in again.stdout
    assert (
        json.loads((tmp_path / "again" / "metrics.json").read_text())["model"]
        == f"from_huggingface {out / 'peft_adapter'}"
    )


@pytest.mark.backend_independent
def test_gpt_recipe_lora_fine_tunes_a_llama_family_checkpoint_for_transformers(tmp_path):
    """--from-huggingface with a Qwen2 checkpoint and --lora-rank: its tokenizer.json, its weights with the
    pairs trained, written back as a checkpoint transformers loads and as a peft adapter."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    checkpoint, hf, _ = llama_family_checkpoint(tmp_path)
    out = tmp_path / "run"
    done = recipe(
        "gpt_lm.py", *short_fine_tuning(checkpoint, tmp_path, out), "--learning-rate", "1e-2", "--lora-rank", "4"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trained = 32 * 4 + 4 * 32 + 32 * 4 + 4 * 16  # query (32 -> 32) and value (32 -> 16: two key/value heads)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["trainable_parameters"] == trained and metrics["vocabulary_size"] == 400
    assert 4.0 < metrics["validation_loss"] < 8.0  # random weights over 400 tokens: about log(400) = 6.0
    import keras_tfm

    exported = transformers.AutoModelForCausalLM.from_pretrained(out / "huggingface").eval()
    assert type(exported).__name__ == "Qwen2ForCausalLM"
    tuned = keras_tfm.from_huggingface(str(out / "peft_adapter"))  # the checkpoint with the run's pairs
    ids = np.arange(12).reshape(2, 6)
    with torch.no_grad():
        expected = exported(torch.tensor(ids)).logits.numpy()
        untuned = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(tuned(ids)), expected, atol=1e-4, rtol=0)
    assert np.abs(expected - untuned).max() > 1e-4  # the pairs moved
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "huggingface")
    assert tokenizer("To be")["input_ids"][0] == 0


@pytest.mark.backend_independent
def test_the_trained_model_carries_its_tokenizer(tmp_path):
    """train(..., tokenizer=...) returns a model that takes and returns text, and whose .keras file keeps
    the tokenizer."""
    import keras_tfm
    from keras_tfm.data import CharacterTokenizer

    tokenizer = CharacterTokenizer.fit("abcdefghij ")
    ids = np.random.default_rng(0).integers(0, tokenizer.vocabulary_size, size=(16, 9)).astype("int32")
    result = train(
        TrainingConfig(output_dir=str(tmp_path / "run"), steps=2, batch_size=8, verbose=0),
        build_model=lambda: keras_tfm.DecoderLM(
            vocabulary_size=tokenizer.vocabulary_size,
            max_length=16,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=16,
        ),
        train_batch=lambda epoch, step: (ids[:8, :-1], ids[:8, 1:]),
        steps_per_pass=2,
        validation_data=(ids[8:, :-1], ids[8:, 1:]),
        loss=keras_tfm.TokenCrossEntropy(),
        tokenizer=tokenizer,
    )
    assert result.model.tokenizer is tokenizer
    text = result.model.generate("abc", max_new_tokens=4)
    assert isinstance(text, str) and text.startswith("abc") and len(text) == 7
    result.model.save(tmp_path / "lm.keras")
    assert keras_tfm.load_model(str(tmp_path / "lm.keras")).generate("abc", max_new_tokens=4) == text
