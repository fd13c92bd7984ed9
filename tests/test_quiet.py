"""What a user's terminal shows: no backend start-up logging or tracing warnings unless asked for."""

import os
import subprocess
import sys

import keras
import pytest

from keras_tfm import backend_logs

# What a user's first script does: seed (which imports TensorFlow on every backend) and generate greedily
# (a traced step on PyTorch). TensorFlow's notices at run time (oneDNN's about int64 ids, at the ERROR
# level) are held back by the level keras_tfm sets, which the script prints.
SCRIPT = """
import os
import keras_tfm  # before Keras: on TensorFlow, Keras' import is TensorFlow's
import keras
keras.utils.set_random_seed(0)
lm = keras_tfm.DecoderLM(vocabulary_size=16, max_length=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8)
print(lm.generate([[1, 2]], max_new_tokens=3).tolist(), os.environ["TF_CPP_MIN_LOG_LEVEL"])
"""


def test_a_first_script_prints_nothing_on_standard_error():
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    environment.update(KERAS_BACKEND=keras.backend.backend(), KERAS_TFM_BACKEND_LOGS="")
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().startswith("[[1, 2,") and run.stdout.strip().endswith("] 3")
    assert run.stderr.splitlines() == []


@pytest.mark.backend_independent
def test_tensorflow_imported_first_still_has_its_first_device_query_filtered(capfd, monkeypatch):
    """Keras imported before keras_tfm has imported TensorFlow (its lines are out by then); the CUDA notice
    its first operation would write comes from the first device query, which keras_tfm then makes inside
    the filter: a stand-in TensorFlow whose query writes that notice to file descriptor 2 shows nothing."""
    import types

    queried = []

    def query(kind):
        queried.append(kind)
        os.write(2, b"E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n")
        return []

    stand_in = types.SimpleNamespace(config=types.SimpleNamespace(list_physical_devices=query))
    monkeypatch.setitem(sys.modules, "tensorflow", stand_in)
    monkeypatch.delenv("KERAS_TFM_BACKEND_LOGS", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    backend_logs.quiet_tensorflow()
    assert queried == ["GPU"] and "cuInit" not in capfd.readouterr().err  # queried now, inside the filter


@pytest.mark.backend_independent
def test_only_known_notices_are_held_back(capfd):
    notice = b"I0000 00:00:1795693235.714294   26414 port.cc:153] oneDNN custom operations are on.\n"
    with backend_logs.native_notices_filtered():
        os.write(
            2, notice + b"E0000 00:00:17956.5 1 op.cc:1] a real failure\nTo enable the following instructions: AVX\n"
        )
    assert capfd.readouterr().err == "E0000 00:00:17956.5 1 op.cc:1] a real failure\n"
