"""`/v1/completions` and `/v1/chat/completions` through the official `openai` client: the answers
are `generate`'s, concurrent requests decode together and none is lost, new rows join while shapes compile."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import numpy as np
import pytest

from keras_tfm.generation import compiled
from tests.serve.helpers import MESSAGES, Server, answer_of, slowed

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")


def test_the_openai_client_gets_what_generate_and_chat_give(model):
    with Server(model, api_key="secret") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="secret", max_retries=0)
        assert [entry.id for entry in client.models.list()] == ["tiny"]
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
        expected = model.chat(MESSAGES, max_new_tokens=8)
        assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "length"
        prompt = model.tokenizer.encode(model.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), 8)

        pieces = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, stream=True
        )
        chunks = list(pieces)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "length"
        both = ["", ""]  # greedy: one row streams both choices
        for piece in client.chat.completions.create(**{**answer_of(MESSAGES), "stream": True, "n": 2}):
            for choice in piece.choices:
                both[choice.index] += choice.delta.content or ""
        assert both == [expected, expected]

        text = model.generate("to be", max_new_tokens=10)[len("to be") :]
        completion = client.completions.create(model="tiny", prompt="to be", max_tokens=10, temperature=0)
        assert completion.choices[0].text == text
        stop = text[4:6]
        cut = client.completions.create(model="tiny", prompt="to be", max_tokens=10, temperature=0, stop=[stop])
        assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
        streamed = client.completions.create(
            model="tiny", prompt="to be", max_tokens=10, temperature=0, stop=[stop], stream=True
        )
        assert "".join(c.choices[0].text for c in streamed) == text[: text.find(stop)]

        sampled = [
            client.completions.create(model="tiny", prompt="to be", max_tokens=10, temperature=1.0, seed=seed)
            .choices[0]
            .text
            for seed in (3, 3, 4)
        ]
        assert sampled[0] == sampled[1] != sampled[2]
        # one chooser, one generator: a seeded request draws what a seeded `generate` draws, every warp on
        warps = dict(temperature=0.9, top_p=0.95, seed=11, frequency_penalty=0.5, presence_penalty=0.3)
        extra = dict(top_k=20, min_p=0.05)
        drawn = client.completions.create(model="tiny", prompt="to be", max_tokens=10, n=2, extra_body=extra, **warps)
        expected = model.generate("to be", max_new_tokens=10, num_return_sequences=2, **extra, **warps)
        assert [choice.text for choice in drawn.choices] == [text[len("to be") :] for text in expected]
        chunks = client.completions.create(
            model="tiny", prompt="to be", max_tokens=10, n=2, extra_body=extra, stream=True, **warps
        )
        texts, ends = ["", ""], [None, None]
        for piece in chunks:
            for choice in piece.choices:
                texts[choice.index] += choice.text
                ends[choice.index] = choice.finish_reason or ends[choice.index]
        assert texts == [choice.text for choice in drawn.choices] and ends == ["length", "length"]
        # logit_bias: a banned token never comes, and the bias shifts the draw as `generate`'s does
        first = int(model.tokenizer.encode(expected[0][len("to be") :])[0])
        boosted = next(int(t) for t in model.tokenizer.encode(" a") if int(t) != first)  # not the banned one
        bias = {first: -100, boosted: 3.0}
        biased = client.completions.create(
            model="tiny", prompt="to be", max_tokens=10, n=2, logit_bias={str(k): v for k, v in bias.items()}, **warps
        )
        expected = model.generate("to be", max_new_tokens=10, num_return_sequences=2, logit_bias=bias, **warps)
        assert [choice.text for choice in biased.choices] == [text[len("to be") :] for text in expected]
        assert all(first not in model.tokenizer.encode(choice.text) for choice in biased.choices)
        # logprobs: the model's log-probabilities of each token (greedy: `generate`'s scores) and the
        # likeliest alternatives, the same streamed or not
        answer = dict(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
        scored = client.chat.completions.create(**answer)
        content = scored.choices[0].logprobs.content
        ids = model.tokenizer.encode(model.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
        _, scores = model.generate([list(ids)], max_new_tokens=6, return_scores=True)
        np.testing.assert_allclose([entry.logprob for entry in content], scores[0], atol=1e-4)
        assert "".join(entry.token for entry in content) == scored.choices[0].message.content
        for entry in content:
            alternatives = [top.logprob for top in entry.top_logprobs]
            assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
            assert entry.top_logprobs[0].token == entry.token and abs(alternatives[0] - entry.logprob) < 1e-6
        streamed = [c for c in client.chat.completions.create(**answer, stream=True) if c.choices]
        pieces = [entry for c in streamed if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
        assert [(e.token, e.logprob) for e in pieces] == [(e.token, e.logprob) for e in content]
        legacy = client.completions.create(model="tiny", prompt="to be", max_tokens=5, temperature=0, logprobs=2)
        lists = legacy.choices[0].logprobs
        assert len(lists.token_logprobs) == 5 and "".join(lists.tokens) == legacy.choices[0].text
        assert all(len(top) <= 2 for top in lists.top_logprobs) and lists.text_offset[0] == 0
        two = client.completions.create(model="tiny", prompt="to be", max_tokens=10, temperature=1.0, n=2)
        assert len(two.choices) == 2 and two.usage.completion_tokens == 20

        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.backend_independent
def test_concurrent_requests_decode_together_and_none_is_lost(model):
    """32 clients at once, prompts of different lengths, `max_tokens` and sampling settings: every answer
    is the one the request gets alone (greedy: `generate`'s; seeded draws: the server's own, whoever shares
    the batch), rows decoded together, and the loops ran at a few cache shapes (a compile each)."""
    asks = [
        ("to be" + " or not" * (i % 5) + "abcdefgh"[i % 8], 3 + i % 4, i if i % 4 == 1 else None) for i in range(32)
    ]
    expected = {(p, m, None): model.generate(p, max_new_tokens=m)[len(p) :] for p, m, seed in asks if seed is None}
    with Server(model, max_batch_size=8) as server:

        def ask(asked):
            prompt, limit, seed = asked
            body = {"model": "tiny", "prompt": prompt, "max_tokens": limit, "temperature": 0 if seed is None else 1}
            answer = httpx.post(server.url + "/v1/completions", json={**body, "seed": seed}, timeout=120)
            assert answer.status_code == 200, answer.text
            return asked, answer.json()["choices"][0]["text"]

        expected.update(ask(asked) for asked in asks if asked[2] is not None)  # alone, one after another
        with concurrent.futures.ThreadPoolExecutor(33) as pool:
            empty = pool.submit(httpx.post, server.url + "/v1/completions", json={"prompt": ""}, timeout=120)
            answers = list(pool.map(ask, asks))  # none fails beside the empty prompt's refusal
        assert empty.result().status_code == 400, empty.result().text
        engine = server.app.state.engine
    assert len(answers) == 32 and all(text == expected[asked] for asked, text in answers)
    assert max(engine.rows_per_chunk) > 1, engine.rows_per_chunk
    # rows in powers of two; lengths a power of two from 32 within the 64-token context
    assert {rows for rows, _ in engine.shapes} <= {1, 2, 4, 8}, engine.shapes
    assert {length for _, length in engine.shapes} <= {32, 64}, engine.shapes


@pytest.mark.backend_independent
def test_warm_up_then_a_request_joins_decoding_rows_while_its_shape_compiles_beside(model, monkeypatch):
    """/health says 503 until the warm-up compiled the shapes of one row it plans, then the others compile
    beside (a progress line each). A short
    request sent while a long stream decodes needs a cache shape not compiled yet: it compiles on another
    thread while the stream goes on (no stall), then the request joins the batch; both get what each
    would get alone."""
    prompt = model.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    long_text = model.generate(prompt, max_new_tokens=40)[len(prompt) :]
    short_text = model.generate("to be", max_new_tokens=3)[len("to be") :]
    lines, release = [], threading.Event()
    progress = lambda line: (lines.append(line), release.wait(60))  # noqa: E731
    with Server(model, max_batch_size=2, warm_up_length=32, progress=progress) as server:
        engine = server.app.state.engine
        deadline = time.time() + 60  # the first shape's compile, then its line; the next waits for `release`
        while not lines and time.time() < deadline:
            time.sleep(0.05)
        assert httpx.get(server.url + "/health").status_code == 503 and lines
        release.set()
        assert engine.ready.wait(120) and httpx.get(server.url + "/health").status_code == 200
        # ready after one row, cache length 32: a prefill, a chunk of the defaults' sampling (greedy rows too),
        # the write of 1 prompt into 1 row and the choice of its first token; then beside, a prompt alone's
        # prefills 16 and 24 wide (in caches of 32: no writes more), the same as before for 2 rows, the write
        # of 1 prompt into 2 rows, and where a chunk cannot skip the sampling, greedy chunks
        assert lines[3].startswith("warm-up 4/4") and {shape[0] for _, shape in engine.compiled.ready} == {1}
        planned = 11 if compiled.takes_branches() else 13
        deadline = time.time() + 120
        while len(lines) < planned and time.time() < deadline:
            time.sleep(0.05)
        assert len(lines) == planned and all(line.startswith("warm-up beside") for line in lines[4:]), lines
        slowed(engine, monkeypatch, 0.4)  # 10 chunks of 4 tokens: four seconds of stream, beside a loaded machine
        compile, during = engine.compiled.compile, []

        def slow_compile(key, shape):  # a compile of a second, at least: two chunks or more go on beside it
            chunks, beside = sum(engine.rows_per_chunk.values()), bool(engine.busy_rows())
            time.sleep(1.0)
            compile(key, shape)
            if beside:  # (the stream's own chunk compiles before its first token, with no row decoding)
                during.append(sum(engine.rows_per_chunk.values()) - chunks)

        monkeypatch.setattr(engine.compiled, "compile", slow_compile)
        streamed = []
        body = {"messages": MESSAGES, "max_tokens": 40, "temperature": 0, "stream": True}

        def stream():
            with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: {"):
                        streamed.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")

        thread = threading.Thread(target=stream)
        thread.start()
        deadline = time.time() + 30
        while not "".join(streamed) and time.time() < deadline:
            time.sleep(0.01)
        short = httpx.post(
            server.url + "/v1/completions", json={"prompt": "to be", "max_tokens": 3, "temperature": 0}, timeout=60
        )
        thread.join(timeout=60)
    assert short.json()["choices"][0]["text"] == short_text and "".join(streamed) == long_text
    assert engine.joined_running == 1 and engine.rows_per_chunk[2] >= 1  # it decoded beside the stream
    assert engine.compiled.stalls == 0 and engine.compiled.beside >= 1 and min(during) >= 2, during


@pytest.mark.backend_independent
def test_a_short_request_right_after_the_warm_up_decodes_in_the_longer_cache_compiled(model, monkeypatch):
    """Ready after one row's prefill and chunk at the longest cache length: a short request is then prefilled
    and decodes there (no compile before its answer) while the shorter ones compile beside, and gets `generate`'s
    answer."""
    from keras_tfm.serve.compiled_shapes import CompiledShapes

    monkeypatch.setattr(CompiledShapes, "compile_later", lambda self, plan, progress: None)  # the rest: later
    expected = model.generate("to be", max_new_tokens=6)[len("to be") :]
    with Server(model, max_batch_size=2, warm_up_length=64) as server:
        engine = server.app.state.engine
        assert engine.ready.wait(120)
        body = {"prompt": "to be", "max_tokens": 6, "temperature": 0}
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert answer["choices"][0]["text"] == expected
    assert next(iter(engine.shapes)) == (1, 64) and engine.compiled.stalls == 0, engine.shapes
    assert {shape for key, shape in engine.compiled.ready if key == ("prefill",)} == {(1, 64)}


@pytest.mark.backend_independent
def test_a_prompt_alone_is_prefilled_whole_and_its_first_token_comes_from_the_prefill(model, monkeypatch):
    """A request alone: a prompt of 35 tokens fills a width of 40 (the next multiple of 8) in a cache of 64,
    which is written into its row, and its first token is chosen from the prefill (no chunk feeds its last
    token); the answer is still `generate`'s. The row is kept while the server idles: the next request alone
    of the same cache shape is written into it, over what the last one left there, and answered as
    `generate` answers it."""
    from keras_tfm.generation.rows import RowState

    made = []
    empty = RowState.empty.__func__
    monkeypatch.setattr(RowState, "empty", classmethod(lambda cls, *a, **k: made.append(a[1:3]) or empty(cls, *a, **k)))
    texts = [("to be or not to be " * 2)[:35], ("or not to be, to be " * 2)[:35]]
    assert [len(model.tokenizer.encode_prompt(text)) for text in texts] == [35, 35]
    expected = [model.generate(text, max_new_tokens=8)[len(text) :] for text in texts]
    with Server(model) as server:
        answers = [
            httpx.post(server.url + "/v1/completions", json={"prompt": text, "max_tokens": 8, "temperature": 0},
                       timeout=60).json()["choices"][0]["text"]
            for text in texts
        ]  # fmt: skip
        ready = server.app.state.engine.compiled.ready
        prefills = {shape for key, shape in ready if key == ("prefill",)}
        firsts = {shape for key, shape in ready if key[0] == "first"}
        writes = {key[1] for key, _ in ready if key[0] == "admit"}
    assert answers == expected and prefills == {(1, 40)} and firsts == {(1, 0)}
    assert writes == {(1, 64)} and made == [(1, 64)], made


@pytest.mark.backend_independent
def test_an_engine_left_open_is_closed_before_the_interpreter_ends(model, monkeypatch):
    """A daemon thread still decoding at exit is stopped inside the runtime's C++, which aborts the process
    (JAX): an engine made without a server's lifespan is closed by an exit hook, its thread ended; one
    closed while it warms up stops after the shape it was compiling."""
    from keras_tfm.serve import workers
    from keras_tfm.serve.compiled_shapes import CompiledShapes
    from keras_tfm.serve.engine import Engine

    compiling = threading.Event()  # the engine's thread has begun its first shape: close it during that one
    compile_shape = CompiledShapes.compile

    def compile_telling(shapes, key, shape):
        if threading.current_thread().name == "keras_tfm-engine":
            compiling.set()
        compile_shape(shapes, key, shape)

    monkeypatch.setattr(CompiledShapes, "compile", compile_telling)

    def engine_threads():
        return [thread for thread in threading.enumerate() if thread.name == "keras_tfm-engine"]

    made, lines = [], []

    def progress(line):  # the first shape compiled: wait until the engine is closed
        lines.append(line)
        deadline = time.time() + 30
        while not (made and made[0]._closed) and time.time() < deadline:
            time.sleep(0.01)

    made.append(Engine(model, max_batch_size=2, warm_up_length=32, progress=progress))
    Engine(model, max_batch_size=2)
    assert len(engine_threads()) >= 2 and compiling.wait(30)
    workers.close_open_workers()  # what `atexit` runs
    assert not engine_threads() and len(lines) == 1, lines


def test_a_model_with_a_position_table_decodes_to_the_end_of_its_context(model):
    """A GPT of 16 positions asked for every token its context leaves: the rows' cache never outgrows
    the position table (chunks of 4 steps overshoot a row's end), and the answer is `generate`'s."""
    import keras_tfm

    gpt = keras_tfm.GPT(vocabulary_size=29, max_length=16, num_layers=1, num_heads=2, hidden_dim=8)
    gpt.tokenizer = model.tokenizer
    room = 16 - len(gpt.tokenizer.encode_prompt("to be"))
    with Server(gpt) as server:
        answer = httpx.post(server.url + "/v1/completions", json={"prompt": "to be", "temperature": 0}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == gpt.generate("to be", max_new_tokens=room)[len("to be") :]
    assert answer.json()["usage"]["completion_tokens"] == room


@pytest.mark.backend_independent  # host-side: what the server answers from the rows it decoded
def test_completions_echo_the_prompt_and_best_of_answers_the_likeliest_draws(model):
    with Server(model) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        greedy = dict(model="tiny", prompt="to be", max_tokens=6, temperature=0)
        plain = client.completions.create(**greedy).choices[0].text
        assert client.completions.create(**greedy, echo=True).choices[0].text == "to be" + plain
        streamed = client.completions.create(**greedy, echo=True, stream=True, n=2)
        texts = ["", ""]
        for piece in streamed:
            for choice in piece.choices:
                texts[choice.index] += choice.text
        assert texts == ["to be" + plain] * 2

        drawn = dict(model="tiny", prompt="to be", max_tokens=6, temperature=1.0, seed=5)
        three = client.completions.create(**drawn, n=3, logprobs=0).choices  # the same rows, seeded
        likeliest = max(three, key=lambda choice: sum(choice.logprobs.token_logprobs))
        best = client.completions.create(**drawn, best_of=3).choices
        assert [choice.text for choice in best] == [likeliest.text] and best[0].logprobs is None
        with pytest.raises(openai.BadRequestError, match="`best_of` must be at least `n`=2"):
            client.completions.create(**drawn, n=2, best_of=1)
        with pytest.raises(openai.BadRequestError, match="cannot be used with `stream`"):
            client.completions.create(**drawn, best_of=2, stream=True)
        # echo with logprobs, as lm-evaluation-harness scores text: the prompt's tokens by a forward pass;
        # a prompt that ends in the token the rows chose scores it as the rows did
        first = client.completions.create(**{**greedy, "max_tokens": 1}, logprobs=2).choices[0]
        asked = {**greedy, "prompt": "to be" + first.text, "max_tokens": 1, "echo": True, "logprobs": 2}
        scored = client.completions.create(**asked).choices[0].logprobs
        count = len(model.tokenizer.encode_prompt("to be" + first.text))
        assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None and len(scored.tokens) == count + 1
        assert scored.token_logprobs[count - 1] == pytest.approx(first.logprobs.token_logprobs[0], abs=1e-4)
        assert scored.top_logprobs[count - 1] == pytest.approx(first.logprobs.top_logprobs[0], abs=1e-4)
        assert "".join(scored.tokens[:count]) == "to be" + first.text
        assert scored.text_offset == [len("".join(scored.tokens[:i])) for i in range(count + 1)]
        pieces = [
            c.choices[0].logprobs for c in client.completions.create(**asked, stream=True) if c.choices[0].logprobs
        ]
        assert sum((piece.tokens for piece in pieces), []) == scored.tokens
        assert sum((piece.text_offset for piece in pieces), []) == scored.text_offset
