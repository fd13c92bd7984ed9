"""Scale-out on the engines that exist: `keras.distribution` on JAX, `tf.distribute` on TensorFlow.

`distribute="data"` (`--distribute data`) replicates the model and splits each global batch over the devices:
JAX `DataParallel` or TensorFlow `MirroredStrategy` (every local GPU, or the CPU's virtual devices).
`distribute="model"` (JAX) lays the devices out as a (batch, model) mesh and shards attention heads and
the feed-forward width over the "model" axis with `layout_map`.

The same flags run on a multi-GPU host unchanged (the devices are the GPUs). On several hosts, start the
recipe on every host; on JAX call `keras.distribution.initialize(coordinator_address, num_processes,
process_id)` first (or set the `KERAS_DISTRIBUTION_*` environment variables it reads), and on TensorFlow
set `TF_CONFIG` and use `MultiWorkerMirroredStrategy`.
"""

from __future__ import annotations

import contextlib
import os

import keras

from keras_tfm.errors import InputError


def use_cpu_devices(count: int) -> None:
    """Splits the CPU into `count` virtual devices; call before the backend first touches a device."""
    backend = keras.backend.backend()
    if backend == "jax":
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
        import jax

        jax.config.update("jax_num_cpu_devices", count)
    elif backend == "tensorflow":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    else:
        raise InputError(f"virtual devices need the jax or tensorflow backend, not {backend}.", argument="count")


def layout_map(device_mesh) -> keras.distribution.LayoutMap:
    """Shards keras_tfm transformers over the mesh's "model" axis, Megatron style: query/key/value and the
    first feed-forward projection by output columns (whole heads, as `num_heads` is a multiple of the axis),
    the attention output and second feed-forward projection by input rows, embeddings by width."""
    layouts = keras.distribution.LayoutMap(device_mesh)
    layouts[r".*/(query|key|value)/kernel"] = (None, "model")
    layouts[r".*/(query|key|value)/bias"] = ("model",)
    layouts[r".*attention/output/kernel"] = ("model", None)
    layouts[r".*feed_forward/intermediate/kernel"] = (None, "model")
    layouts[r".*feed_forward/intermediate/bias"] = ("model",)
    layouts[r".*feed_forward/output/kernel"] = ("model", None)
    layouts[r".*_embedding/embeddings"] = (None, "model")
    return layouts


def distribution_scope(distribute: str, model_parallel: int | None = None, log=print):
    """Sets up `distribute` ("none", "data", "model") and returns the context to build and compile the model in."""
    if distribute == "none":
        return contextlib.nullcontext()
    backend = keras.backend.backend()
    if backend == "jax":
        devices = keras.distribution.list_devices()
        if distribute == "data":
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
            log(f"Distribution: JAX DataParallel over {len(devices)} devices.")
        else:
            model_axis = model_parallel or len(devices)
            if len(devices) % model_axis:
                raise InputError(
                    f"must divide the {len(devices)} devices; got {model_axis}.", argument="model_parallel"
                )
            mesh = keras.distribution.DeviceMesh((len(devices) // model_axis, model_axis), ["batch", "model"], devices)
            keras.distribution.set_distribution(
                keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")
            )
            log(f"Distribution: JAX ModelParallel, mesh {mesh.shape} (batch, model).")
        return contextlib.nullcontext()
    if backend == "tensorflow":
        if distribute == "model":
            raise InputError(
                'model parallelism ("model") is implemented on the jax backend; use "data" on tensorflow.',
                argument="distribute",
            )
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        strategy = tf.distribute.MirroredStrategy(devices)
        log(f"Distribution: TensorFlow MirroredStrategy over {strategy.num_replicas_in_sync} devices.")
        return strategy.scope()
    raise InputError(
        f"{distribute!r}: supported on the jax and tensorflow backends, not {backend}; "
        "run with KERAS_BACKEND=jax or tensorflow.",
        argument="distribute",
    )
