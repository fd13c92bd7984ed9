"""`/v1/embeddings` through the official openai client: what `embed` gives, for every input form, batched
across requests; the same refusals as the other routes."""

import base64
import concurrent.futures
import re

import httpx
import numpy as np
import pytest

import keras_tfm
from keras_tfm.data import WordPieceTokenizer
from tests.checks import bert_vocabulary
from tests.serve.helpers import Server

openai = pytest.importorskip("openai")

TEXTS = ["The cat sat on the mat.", "", "a dog runs fast " * 20, "Hello, world!"]


@pytest.fixture(scope="module")
def embedder():
    tokenizer = WordPieceTokenizer(bert_vocabulary(" ".join(TEXTS)))
    encoder = keras_tfm.Bert(
        vocabulary_size=tokenizer.vocabulary_size, max_length=32, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32,
    )  # fmt: skip
    model = keras_tfm.SentenceEmbedder(encoder, pooling=("mean", "cls"), max_sequence_length=24)
    model.tokenizer = tokenizer
    return model


def test_the_openai_client_gets_what_embed_gives(embedder):
    expected = embedder.embed(TEXTS)
    ids = embedder.encode(TEXTS)
    with Server(embedder, name="minilm", api_key="secret", max_batch_size=4) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="secret", max_retries=0)
        assert client.models.retrieve("minilm").model_extra["dimensions"] == 32
        reply = client.embeddings.create(model="minilm", input=TEXTS)  # the client asks for base64 and decodes it
        np.testing.assert_allclose([item.embedding for item in reply.data], expected, atol=1e-6)
        assert [item.index for item in reply.data] == [0, 1, 2, 3]
        assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(len(row) for row in ids)
        floats = client.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float")
        np.testing.assert_allclose(floats.data[0].embedding, expected[0], atol=1e-6)
        by_ids = client.embeddings.create(model="minilm", input=[row.tolist() for row in ids], encoding_format="float")
        np.testing.assert_allclose([item.embedding for item in by_ids.data], expected, atol=1e-6)
        one = client.embeddings.create(model="minilm", input=ids[0].tolist(), encoding_format="float")
        np.testing.assert_allclose(one.data[0].embedding, expected[0], atol=1e-6)
        short = client.embeddings.create(model="minilm", input=TEXTS, dimensions=8, encoding_format="float")
        cut = expected[:, :8] / np.linalg.norm(expected[:, :8], axis=-1, keepdims=True)  # unit length again
        np.testing.assert_allclose([item.embedding for item in short.data], cut, atol=1e-6)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # requests at once share batches
            answers = list(
                pool.map(lambda i: client.embeddings.create(model="minilm", input=TEXTS[i % 4 :]), range(16))
            )
        for i, answer in enumerate(answers):
            np.testing.assert_allclose([item.embedding for item in answer.data], expected[i % 4 :], atol=1e-6)
        metrics = httpx.get(server.url + "/metrics").text
        assert 'keras_tfm_requests_total{method="POST",route="/v1/embeddings",status="200"} 21.0' in metrics


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(embedder):
    with Server(embedder, name="minilm") as server:
        url = server.url + "/v1/embeddings"
        for body, param, message in (
            ({"input": "a", "normalize": True}, "normalize", "unknown field `normalize`"),
            ({"input": []}, "input", "`input` must be a string or a list of 1 to 2048"),
            ({"input": ["a", [1, 2]]}, "input", "`input` must hold strings, or lists of token ids"),
            ({"input": [[1, 10_000]]}, "input", r"at most 24 ids in \[0, "),
            ({"input": [[2] * 25]}, "input", "at most 24 ids"),
            ({"input": "a", "dimensions": 33}, "dimensions", r"`dimensions` must be an integer in \[1, 32\]"),
            ({"input": "a", "encoding_format": "hex"}, "encoding_format", "must be 'float' or 'base64'"),
            ({"input": "a", "model": "gpt"}, "model", "the model 'gpt' does not exist"),
        ):
            reply = httpx.post(url, json=body)
            assert reply.status_code in (400, 404), reply.text
            error = reply.json()["error"]
            assert error["param"] == param and re.search(message, error["message"]), error
        chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
        assert chat.status_code == 400 and "embeds text and does not generate it" in chat.json()["error"]["message"]
        vector = httpx.post(url, json={"input": "Hello", "encoding_format": "base64"}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(vector), "<f4"), embedder.embed("Hello"), atol=1e-6)


class Recorded:
    """The batcher's side of a model: vectors that say which input they are, each batch recorded and
    held until `release` is set (`hold` False: not held)."""

    def __init__(self, hold: bool = True):
        import threading

        self.batches, self.release, self.hold = [], threading.Event(), hold

    def embed_token_ids(self, ids, batch_size):
        self.batches.append([row[0] for row in ids])
        if self.hold:
            self.release.wait(10)
        return np.asarray([[row[0]] for row in ids], "float32")


@pytest.mark.backend_independent
def test_requests_that_wait_are_embedded_together_and_a_small_one_is_not_starved():
    """While one batch is embedded, the requests that come wait, then go in one batch (up to max_batch_size
    inputs), each answered with its own vectors. A large request is embedded a batch at a time: a one-input
    request that comes behind two of 12 inputs is answered in the next batch, not after 24 inputs."""
    import asyncio

    from keras_tfm.serve.embeddings import EmbeddingBatcher

    model = Recorded()
    batcher = EmbeddingBatcher(model, max_batch_size=4, max_queue=8)

    async def requests():
        first = asyncio.ensure_future(batcher.embed([[0]]))
        while not model.batches:
            await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(batcher.embed([[i], [i + 10]])) for i in (1, 2, 3)]
        await asyncio.sleep(0.05)
        model.release.set()
        together = await asyncio.gather(first, *waiting)
        model.release.clear()
        large = [asyncio.ensure_future(batcher.embed([[100 * k + i] for i in range(12)])) for k in (1, 2)]
        while not model.batches[3:]:
            await asyncio.sleep(0.01)
        small = asyncio.ensure_future(batcher.embed([[7]]))
        await asyncio.sleep(0.05)
        model.release.set()
        return together, await asyncio.gather(*large, small)

    together, (first_large, second_large, small) = asyncio.run(requests())
    batcher.close()
    assert model.batches[:3] == [[0], [1, 11, 2, 12], [3, 13]]  # 1; then 2 + 2 inputs; then the last request
    assert [answer[:, 0].tolist() for answer in together] == [[0], [1, 11], [2, 12], [3, 13]]
    # the oldest takes half a batch, then the smallest come first: the one input in the batch after it came
    assert model.batches[3] == [100, 101, 200, 201] and model.batches[4] == [102, 103, 7, 202]
    assert small[:, 0].tolist() == [7] and first_large[:, 0].tolist() == list(range(100, 112))
    assert second_large[:, 0].tolist() == list(range(200, 212)) and sum(map(len, model.batches)) == 1 + 6 + 25


@pytest.mark.backend_independent
def test_a_shutdown_answers_the_waiting_with_503_and_the_thread_ends_at_once():
    """Draining (the server's SIGTERM) while a batch is embedded: the requests waiting get the documented
    503 at once, the batch finishes, its unfinished request gets the 503 too, and the thread ends; a
    request whose client left is dropped, never answered twice."""
    import asyncio
    import time

    from keras_tfm.serve.embeddings import EmbeddingBatcher
    from keras_tfm.serve.requests import RequestError

    model = Recorded()
    batcher = EmbeddingBatcher(model, max_batch_size=2, max_queue=8)

    async def requests():
        running = asyncio.ensure_future(batcher.embed([[1], [2], [3]]))
        while not model.batches:
            await asyncio.sleep(0.01)
        left = asyncio.ensure_future(batcher.embed([[4]]))
        waiting = [asyncio.ensure_future(batcher.embed([[5 + i]])) for i in range(4)]
        await asyncio.sleep(0.05)
        left.cancel()
        started = time.monotonic()
        batcher.drain()
        answers = await asyncio.gather(*waiting, return_exceptions=True)
        waited = time.monotonic() - started
        model.release.set()
        return answers, waited, (await asyncio.gather(running, return_exceptions=True))[0]

    answers, waited, running = asyncio.run(requests())
    batcher.thread.join(5)
    assert not batcher.thread.is_alive() and waited < 1
    assert all(isinstance(a, RequestError) and a.status == 503 and a.kind == "server_error" for a in answers)
    assert isinstance(running, RequestError) and running.status == 503  # 2 of its 3 inputs were embedded
    assert model.batches == [[1, 2]]
    with pytest.raises(RequestError, match="shutting down"):
        asyncio.run(batcher.embed([[9]]))


@pytest.mark.backend_independent  # the server's reading of inputs; the towers' outputs on every backend: test_clip.py
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_an_image_text_model_embeds_texts_and_image_data_urls(tmp_path, family):
    """A CLIP or SigLIP checkpoint served: texts and images (base64 data URLs) in one request, each the vector that
    `embed_texts` or `embed_images` gives; an image that does not decode is a 400 naming the input."""
    import io

    import matplotlib
    from PIL import Image

    from tests.convert.test_clip import write_clip_checkpoint
    from tests.convert.test_siglip import write_siglip_checkpoint

    (write_clip_checkpoint if family == "clip" else write_siglip_checkpoint)(tmp_path)
    clip = keras_tfm.from_huggingface(str(tmp_path))
    photo = Image.open(f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg")
    buffer = io.BytesIO()
    photo.save(buffer, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    texts = ["a photo of a cat.", "a dog"]
    with Server(clip, name="clip") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        reply = client.embeddings.create(model="clip", input=[texts[0], data_url, texts[1]])
        vectors = np.array([item.embedding for item in reply.data])
        np.testing.assert_allclose(vectors[[0, 2]], clip.embed_texts(texts), atol=1e-5)
        np.testing.assert_allclose(vectors[1], clip.embed_images(np.asarray(photo.convert("RGB"))), atol=1e-5)
        tokens = sum(len(row) for row in clip.tokenizer.encode_batch(texts))
        # the texts' tokens, the image's patches (and CLIP's class token)
        assert reply.usage.prompt_tokens == tokens + (16 // 8) ** 2 + (family == "clip")
        with pytest.raises(openai.BadRequestError, match="input 1 is an image data URL that does not decode") as bad:
            client.embeddings.create(model="clip", input=[texts[0], "data:image/png;base64,aGVsbG8="])
        assert bad.value.body["param"] == "input"
        again = client.embeddings.create(model="clip", input=texts[1])  # still serving
        np.testing.assert_allclose(again.data[0].embedding, clip.embed_texts(texts[1]), atol=1e-5)
