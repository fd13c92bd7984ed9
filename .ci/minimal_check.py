"""The minimal-install stage's two halves (see .ci/minimal).

python .ci/minimal_check.py write DIR        in the full environment: a chat checkpoint in DIR
python .ci/minimal_check.py check DIR OUT    in a minimal one: use it as the README shows, writing to OUT
                                             (with the serve extra: the server too)
"""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare", "input.txt")
TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] == 'system' %}{% continue %}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPT = "To be, or not"
TEXTS = ["To be, or not to be", "", "that is the question"]


def write(directory: str) -> None:
    """A small Llama-family checkpoint with a byte-level BPE tokenizer.json, a chat template and end ids."""
    import keras
    import numpy as np
    from tokenizers import ByteLevelBPETokenizer

    import keras_tfm
    from keras_tfm.data import HuggingFaceTokenizer

    with open(SHAKESPEARE, encoding="utf-8") as file:
        text = file.read()[:50_000]
    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator(
        [text], vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"], show_progress=False
    )
    tokenizer = HuggingFaceTokenizer(learner._tokenizer.to_str(), chat_template=TEMPLATE)
    model = keras_tfm.DecoderLM(
        vocabulary_size=tokenizer.vocabulary_size,
        max_length=64,
        num_layers=1,
        num_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
    )
    model.tokenizer = tokenizer
    model.generation_config = {"eos_token_id": 1}  # <|im_end|>
    keras_tfm.save_huggingface(model, directory)
    ids = np.arange(12).reshape(2, 6)
    np.save(os.path.join(directory, "reference_logits.npy"), keras.ops.convert_to_numpy(model(ids)))
    write_embedder(os.path.join(directory, "embedder"), text)


def write_embedder(directory: str, text: str) -> None:
    """A sentence-transformers checkpoint (a small BERT, a WordPiece vocab.txt) and its vectors of TEXTS."""
    import numpy as np

    import keras_tfm
    from keras_tfm.data import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.fit(text, vocabulary_size=200)
    encoder = keras_tfm.Bert(vocabulary_size=tokenizer.vocabulary_size, max_length=32, num_layers=1, num_heads=2,
                             hidden_dim=16, intermediate_dim=32)  # fmt: skip
    embedder = keras_tfm.SentenceEmbedder(encoder)
    embedder.tokenizer = tokenizer
    keras_tfm.save_huggingface(embedder, directory)
    np.save(os.path.join(directory, "reference_vectors.npy"), embedder.embed(TEXTS))


def check(directory: str, out: str) -> None:
    start = time.perf_counter()
    import keras_tfm

    seconds = time.perf_counter() - start
    import keras
    import numpy as np

    backend = keras.backend.backend()
    extra = sorted(name for name in ("tensorflow", "torch", "jax", "transformers") if name in sys.modules)
    assert extra == [backend] or (backend == "tensorflow" and extra == ["tensorflow"]), f"imported {extra}"
    installed = [name for name in ("tensorflow", "tensorflow_text", "keras_hub") if importlib.util.find_spec(name)]
    assert not installed, f"the {backend} install holds {installed}"

    model = keras_tfm.from_huggingface(directory)
    logits = keras.ops.convert_to_numpy(model(np.arange(12).reshape(2, 6)))
    np.testing.assert_allclose(logits, np.load(os.path.join(directory, "reference_logits.npy")), atol=1e-5)
    text = model.generate(PROMPT, max_new_tokens=8)
    assert isinstance(text, str) and text.startswith(PROMPT), text
    assert PROMPT + "".join(model.stream(PROMPT, max_new_tokens=8, chunk_size=3)) == text
    reply = model.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], max_new_tokens=8
    )
    assert isinstance(reply, str)

    command = [sys.executable, "-m", "keras_tfm", "generate", directory, PROMPT, "--max-new-tokens", "8"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == text + "\n", done.stdout + done.stderr[-2000:]

    embedder = keras_tfm.from_huggingface(os.path.join(directory, "embedder"))
    vectors = np.load(os.path.join(directory, "embedder", "reference_vectors.npy"))
    np.testing.assert_allclose(embedder.embed(TEXTS), vectors, atol=1e-5)
    keras_tfm.save_huggingface(model, os.path.join(out, "saved"))
    again = keras.ops.convert_to_numpy(
        keras_tfm.from_huggingface(os.path.join(out, "saved"))(np.arange(12).reshape(2, 6))
    )
    np.testing.assert_allclose(again, logits, atol=1e-6)

    flags = [
        "--data",
        SHAKESPEARE,
        "--steps",
        "4",
        "--steps-per-epoch",
        "2",
        "--sample-every",
        "0",
        "--num-layers",
        "1",
    ]
    flags += [
        "--num-heads",
        "2",
        "--hidden-dim",
        "32",
        "--max-length",
        "32",
        "--batch-size",
        "8",
        "--eval-batches",
        "2",
    ]
    flags += ["--sample-tokens", "8", "--verbose", "2", "--output-dir", os.path.join(out, "run")]
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "recipes", "gpt_lm.py"), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.load(open(os.path.join(out, "run", "metrics.json")))["steps"] == 4
    flags[-1] = os.path.join(out, "board")  # TensorBoard logs need an extra this install lacks: said before training
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "recipes", "gpt_lm.py"), *flags, "--tensorboard"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "pip install 'keras_tfm[tensorboard]'" in done.stderr, done.stderr[-2000:]
    from keras_tfm.errors import InputError

    try:  # GGUF files need the gguf extra, which this install lacks: said by name
        keras_tfm.from_gguf(os.path.join(out, "model.gguf"))
        raise AssertionError("from_gguf ran without the gguf package")
    except InputError as error:
        assert "pip install 'keras_tfm[gguf]'" in str(error), error
    try:  # an export this backend cannot write: refused by name, with the backend that can
        model.export(os.path.join(out, "model.onnx"), format="onnx")
        raise AssertionError(f"ONNX export ran on {backend}")
    except InputError as error:
        assert "KERAS_BACKEND=tensorflow and export it there" in str(error), error
    if importlib.util.find_spec("uvicorn"):
        served = serve(directory, text)
    else:
        served = subprocess.run(  # the server too: its extra named, before any model is loaded
            [sys.executable, "-m", "keras_tfm.serve", directory], capture_output=True, text=True, timeout=300
        )
        assert served.returncode == 1 and "pip install 'keras_tfm[serve]'" in served.stderr, served.stderr[-2000:]
        served = "the server asked for its extra"
    size = sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(sysconfig.get_paths()["purelib"])
        for name in names
        if not os.path.islink(os.path.join(folder, name))
    )
    print(
        f"{backend}: import keras_tfm {seconds:.1f} s (no other framework imported, no TensorFlow installed: "
        f"{size / 2**20:,.0f} MiB installed); from_huggingface, generate, stream, chat, embed, python -m keras_tfm "
        f"generate, save_huggingface and the GPT recipe ran; {served}; from_gguf asked for its extra, ONNX export "
        "for TensorFlow"
    )


def serve(directory: str, text: str) -> str:
    """The server of this install answers a completion as `generate` does, then stops on SIGTERM."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "keras_tfm.serve", directory, "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                time.sleep(0.2)
        body = json.dumps({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, timeout=120))
        assert PROMPT + answer["choices"][0]["text"] == text, answer
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0, err[-2000:]
    return "the server answered as generate and stopped on SIGTERM"


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](*sys.argv[2:])
