"""Llama-family generation speed on this machine: greedy new tokens/s of a SmolLM2-135M-shaped model
(30 layers, 9 query and 3 key/value heads, 576 wide, SwiGLU 1536, vocabulary 49152, tied output;
random weights), batch 1, a 128-token prompt, 128 new tokens: keras_tfm's `DecoderLM` vs keras-hub's
`LlamaCausalLM` (each Keras backend) vs transformers' `LlamaForCausalLM.generate` (PyTorch), and the
bound of this machine: the same matrix products alone in JAX (`matmul_ceiling`). `stream`: what
`DecoderLM.stream` (chunks of 16) costs against `generate` for 200 new tokens, each backend. `dtype`:
the same generation in float32 and bfloat16 (keras_tfm's dtype policy, transformers' `model.to`), and
with int8 weights (`model.quantize("int8")` of the float32 model).
`int8`: what weight-only int8 could gain, each backend: one step's matrix products alone, in float32 and
with int8 weights (`products_of_a_step`).

    python benchmarks/decoder_lm.py [--rounds 2] [--only generate | stream | dtype | int8]

Writes benchmarks/results/decoder_lm.json.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKENDS, DEFAULT_CONTENDERS, Timer, main  # noqa: E402

CONFIG = dict(
    vocabulary_size=49152,
    num_layers=30,
    num_heads=9,
    num_key_value_heads=3,
    hidden_dim=576,
    intermediate_dim=1536,
    rope_theta=100000.0,
    layer_norm_epsilon=1e-5,
)
GENERATE = dict(prompt=128, new_tokens=128, repeats=3)
STREAM = dict(prompt=16, new_tokens=200)  # what streaming costs: `stream` against `generate`


def prompt_ids():
    import numpy as np

    return np.random.default_rng(0).integers(0, CONFIG["vocabulary_size"], size=(1, GENERATE["prompt"]))


def timed(generate) -> dict:
    """Tokens/s of the fastest of `repeats` calls after one that compiles."""
    generate()
    rates = []
    for _ in range(GENERATE["repeats"]):
        with Timer() as timer:
            generate()
        rates.append(GENERATE["new_tokens"] / timer.seconds)
    return {"value": max(rates), "windows": [round(rate, 1) for rate in rates]}


def matmul_ceiling() -> dict:
    """The speed bound of this task on this machine: only the model's matrix products (the prefill of the
    prompt, then one token at a time through every projection and the tied output), in one `jax.jit`
    loop, with nothing else: no attention, norms or cache. At batch 1 they read every weight once per
    token, so memory bandwidth bounds them."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    hidden, inner = CONFIG["hidden_dim"], CONFIG["intermediate_dim"]
    kv = hidden // CONFIG["num_heads"] * CONFIG["num_key_value_heads"]
    rng = np.random.default_rng(0)
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, inner), (hidden, inner)]
    layers = [
        [jnp.asarray(rng.normal(size=shape).astype("float32") * 0.02) for shape in [*shapes, (inner, hidden)]]
        for _ in range(CONFIG["num_layers"])
    ]
    table = jnp.asarray(rng.normal(size=(CONFIG["vocabulary_size"], hidden)).astype("float32") * 0.02)

    def forward(h):
        for query, key, value, output, gate, up, down in layers:
            h = h + (h @ query + jnp.pad(h @ key + h @ value, ((0, 0), (0, 0), (0, hidden - kv)))) @ output
            h = h + (jax.nn.silu(h @ gate) * (h @ up)) @ down
        return h

    @jax.jit
    def generate(prompt):
        h = forward(prompt)[:, -1:]

        def step(_, h):
            logits = forward(h) @ table.T
            return h + logits[..., :hidden] * 1e-3

        return jax.lax.fori_loop(0, GENERATE["new_tokens"], step, h)

    prompt = jnp.ones((1, GENERATE["prompt"], hidden), "float32")
    return timed(lambda: generate(prompt).block_until_ready())


def products_of_a_step(mode: str) -> dict:
    """Every matrix product of one decoding step at batch 1 (each layer's seven projections and the tied
    output), nothing else, in float32 or with weight-only int8 weights (`int8`: scaled per output
    channel, the product with float32 activations; `int8_bfloat16`: with bfloat16 ones), compiled as
    each backend decodes: `jax.jit`, `tf.function(jit_compile=True)`, PyTorch's
    `torch._weight_int8pack_mm` (its CPU kernel for weight-only int8). Steps/s: the bound on tokens/s
    that the products alone set."""
    import keras
    import numpy as np

    hidden, inner = CONFIG["hidden_dim"], CONFIG["intermediate_dim"]
    kv = hidden // CONFIG["num_heads"] * CONFIG["num_key_value_heads"]
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, inner), (hidden, inner)]
    shapes = shapes * CONFIG["num_layers"] + [(inner, hidden)] * CONFIG["num_layers"]
    shapes.append((hidden, CONFIG["vocabulary_size"]))
    rng = np.random.default_rng(0)
    kernels = [rng.normal(size=shape).astype("float32") * 0.02 for shape in shapes]
    scales = [np.abs(kernel).max(axis=0) / 127 for kernel in kernels]
    quantized = [np.round(kernel / scale).astype("int8") for kernel, scale in zip(kernels, scales)]
    inputs = {k: rng.normal(size=(1, k)).astype("float32") for k in (hidden, inner)}
    step = _backend_products(keras.backend.backend(), mode, kernels, quantized, scales, inputs)
    for _ in range(3):
        step()
    rates = []
    for _ in range(GENERATE["repeats"]):
        with Timer() as timer:
            for _ in range(20):
                step()
        rates.append(20 / timer.seconds)
    return {"value": max(rates), "windows": [round(rate, 1) for rate in rates]}


def _backend_products(backend: str, mode: str, kernels, quantized, scales, inputs):
    import keras

    if backend == "torch":
        import torch

        dtype = torch.bfloat16 if mode == "int8_bfloat16" else torch.float32
        xs = {k: torch.tensor(x, dtype=dtype) for k, x in inputs.items()}
        if mode == "float32":
            weights = [torch.tensor(kernel) for kernel in kernels]
            return lambda: [xs[w.shape[0]] @ w for w in weights]
        # the kernel wants (output, input) int8 rows and scales of the activations' dtype
        packed = [(torch.tensor(q.T.copy()), torch.tensor(s, dtype=dtype)) for q, s in zip(quantized, scales)]
        return lambda: [torch._weight_int8pack_mm(xs[q.shape[1]], q, s) for q, s in packed]
    xs = dict(inputs)
    if mode == "float32":
        arguments = (kernels,)

        def products(kernels):
            return [xs[kernel.shape[0]] @ kernel for kernel in kernels]
    else:
        arguments = (quantized, scales)

        def products(quantized, scales):
            cast = "bfloat16" if mode == "int8_bfloat16" else "float32"
            return [
                (keras.ops.cast(xs[q.shape[0]], cast) @ keras.ops.cast(q, cast)) * keras.ops.cast(s, cast)
                for q, s in zip(quantized, scales)
            ]

    if backend == "jax":
        import jax

        compiled, arguments = jax.jit(products), jax.device_put(arguments)
        return lambda: jax.block_until_ready(compiled(*arguments))
    import tensorflow as tf

    compiled = tf.function(products, jit_compile=True)
    arguments = tf.nest.map_structure(tf.constant, arguments)
    return lambda: [out.numpy() for out in compiled(*arguments)[-1:]]


def smollm_shaped(max_length: int, dtype: str | None = None, config: dict = CONFIG):
    """keras_tfm's DecoderLM of `config`, random weights (`dtype`: its dtype policy; None: Keras' default)."""
    import keras_tfm

    return keras_tfm.DecoderLM(
        dtype=dtype,
        vocabulary_size=config["vocabulary_size"],
        max_length=max_length,
        num_layers=config["num_layers"],
        num_heads=config["num_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        hidden_dim=config["hidden_dim"],
        intermediate_dim=config["intermediate_dim"],
        rotary_embedding={"max_wavelength": config["rope_theta"]},
        layer_norm_epsilon=config["layer_norm_epsilon"],
    )


def hugging_face_llama(max_length: int, config: dict = CONFIG):
    """transformers' LlamaForCausalLM of `config` (tied output, no end id), random weights, in the default
    dtype of PyTorch and on its default device."""
    import transformers

    hf_config = transformers.LlamaConfig(
        vocab_size=config["vocabulary_size"],
        num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        hidden_size=config["hidden_dim"],
        intermediate_size=config["intermediate_dim"],
        rope_theta=config["rope_theta"],
        rms_norm_eps=config["layer_norm_epsilon"],
        max_position_embeddings=max_length,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    return transformers.LlamaForCausalLM(hf_config).eval()


def streaming(stream: bool) -> dict:
    """keras_tfm's `generate` or `stream` (chunks of 16) of STREAM["new_tokens"] greedy tokens."""
    import numpy as np

    prompt = prompt_ids()[0, : STREAM["prompt"]].astype("int32")
    total = STREAM["prompt"] + STREAM["new_tokens"]
    model = smollm_shaped(total)

    def run():
        if stream:
            new = np.concatenate(list(model.stream(prompt, max_new_tokens=STREAM["new_tokens"], chunk_size=16)))
        else:
            new = model.generate(prompt, max_new_tokens=STREAM["new_tokens"])[0, STREAM["prompt"] :]
        assert len(new) == STREAM["new_tokens"]

    run()
    rates = []
    for _ in range(GENERATE["repeats"]):
        with Timer() as timer:
            run()
        rates.append(STREAM["new_tokens"] / timer.seconds)
    return {"value": max(rates), "windows": [round(rate, 1) for rate in rates]}


def worker(contender: str, task: str) -> dict:
    import numpy as np

    if task == "stream":
        return streaming(contender == "keras_tfm_stream")
    if task == "int8":
        return products_of_a_step(contender)
    prompt = prompt_ids().astype("int32")
    total = GENERATE["prompt"] + GENERATE["new_tokens"]
    if contender.startswith("keras_tfm"):  # keras_tfm, keras_tfm_float32, keras_tfm_bfloat16, keras_tfm_int8
        dtype = contender.split("_")[-1] if contender != "keras_tfm" else None
        model = smollm_shaped(total, "float32" if dtype == "int8" else dtype)
        if dtype == "int8":
            model.quantize("int8")

        def generate():
            out = model.generate(prompt, max_new_tokens=GENERATE["new_tokens"])
            assert out.shape == (1, total)

        return timed(generate)

    if contender == "keras_hub":
        import keras_hub

        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=CONFIG["vocabulary_size"],
            num_layers=CONFIG["num_layers"],
            num_query_heads=CONFIG["num_heads"],
            num_key_value_heads=CONFIG["num_key_value_heads"],
            hidden_dim=CONFIG["hidden_dim"],
            intermediate_dim=CONFIG["intermediate_dim"],
            rope_max_wavelength=CONFIG["rope_theta"],
            layer_norm_epsilon=CONFIG["layer_norm_epsilon"],
            tie_word_embeddings=True,
        )
        model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
        ids = np.zeros((1, total), "int32")
        ids[:, : GENERATE["prompt"]] = prompt
        mask = np.zeros((1, total), bool)
        mask[:, : GENERATE["prompt"]] = True
        inputs = {"token_ids": ids, "padding_mask": mask}
        return timed(lambda: model.generate(inputs, stop_token_ids=None))

    if contender == "matmul_ceiling":
        return matmul_ceiling()

    if contender.startswith("hugging_face"):  # hugging_face, hugging_face_float32, hugging_face_bfloat16
        import torch

        model = hugging_face_llama(total)
        model = model.to(torch.bfloat16) if contender.endswith("bfloat16") else model
        prompt = torch.tensor(prompt, dtype=torch.long)
        kwargs = dict(
            max_new_tokens=GENERATE["new_tokens"],
            min_new_tokens=GENERATE["new_tokens"],
            do_sample=False,
            pad_token_id=0,
            attention_mask=torch.ones_like(prompt),
        )
        with torch.no_grad():
            return timed(lambda: model.generate(prompt, **kwargs))
    raise ValueError(contender)


if __name__ == "__main__":
    main(
        __doc__,
        os.path.abspath(__file__),
        worker,
        {
            "generate": ("Greedy generation, SmolLM2-135M shape, batch 1, 128 + 128 tokens", "new tokens/s"),
            "stream": ("Streaming in chunks of 16 against generate, 16 + 200 tokens", "new tokens/s"),
            "dtype": (
                "Greedy generation in float32, bfloat16 and int8 (`quantize`), SmolLM2-135M shape, 128 + 128 tokens",
                "new tokens/s",
            ),
            "int8": (
                "The matrix products of one decoding step alone, float32 and weight-only int8, SmolLM2-135M shape, batch 1",
                "steps/s",
            ),
        },
        contenders=[*DEFAULT_CONTENDERS, ("matrix products only (jax)", "matmul_ceiling", "jax")],
        baselines={f"keras-hub {backend}": f"keras_hub ({backend})" for backend in BACKENDS}
        | {"Hugging Face": "hugging_face (torch)"},
        results_name="decoder_lm",
        same_backend={"stream": "keras_tfm generate", "dtype": "keras_tfm float32", "int8": "float32 products"},
        task_contenders={
            "stream": (
                [
                    (f"keras_tfm {how} ({backend})", f"keras_tfm_{how}", backend)
                    for backend in BACKENDS
                    for how in ("generate", "stream")
                ],
                {f"generate {backend}": f"keras_tfm generate ({backend})" for backend in BACKENDS},
            ),
            "dtype": (
                [
                    (f"keras_tfm {dtype} ({backend})", f"keras_tfm_{dtype}", backend)
                    for backend in BACKENDS
                    for dtype in ("float32", "bfloat16", "int8")
                ]
                + [
                    (f"transformers {dtype} (torch)", f"hugging_face_{dtype}", "torch")
                    for dtype in ("float32", "bfloat16")
                ],
                {f"float32 {backend}": f"keras_tfm float32 ({backend})" for backend in BACKENDS},
            ),
            "int8": (
                [
                    (f"{mode} products ({backend})", mode, backend)
                    for backend in BACKENDS
                    for mode in ("float32", "int8", "int8_bfloat16")
                ],
                {f"float32 {backend}": f"float32 products ({backend})" for backend in BACKENDS},
            ),
        },
    )
