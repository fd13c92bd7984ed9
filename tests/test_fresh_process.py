"""What a user's fresh interpreter does, apart from what the test process has imported already
(transformers, every backend): the imports `keras_tfm` makes, and chat templates without transformers."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys, time
start = time.perf_counter()
import keras_tfm
seconds = time.perf_counter() - start
from keras_tfm.data.chat import render_chat_template
template = "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
text = render_chat_template(template, [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])
import keras
from keras_tfm import compat
with compat.configs_without_tensorflow():  # Keras' get_config would import TensorFlow to ask about values
    keras.layers.Dense(2).get_config()
print(json.dumps({"text": text, "seconds": seconds, "modules": sorted(m for m in ("tensorflow", "torch", "transformers") if m in sys.modules)}))
"""


@pytest.mark.backend_independent
def test_import_on_jax_loads_no_other_framework_and_chat_templates_render():
    """`jinja2.ext` (loop controls) is a submodule that only an earlier import of transformers had loaded;
    `compat.configs_without_tensorflow` keeps a layer's `get_config` from importing TensorFlow."""
    environment = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["text"] == "<user>hi"
    assert result["modules"] == []  # neither TensorFlow nor PyTorch nor transformers
