"""Scale-out on the engines that exist: `keras.distribution` on JAX, `tf.distribute` on TensorFlow.

`distribute="data"` (`--distribute data`) replicates the model and splits each global batch over the devices:
JAX `DataParallel`, or TensorFlow `MirroredStrategy` (every local GPU, or the CPU's virtual devices).
`distribute="model"` (JAX) lays the devices out as a (batch, model) mesh and shards attention heads and
the feed-forward width over the "model" axis with `layout_map`.

Several processes (hosts): on JAX every process starts the same command with the coordinator's address,
the number of processes and its own index (`initialize_processes`); on TensorFlow every worker sets
`TF_CONFIG` and "data" becomes `MultiWorkerMirroredStrategy`. The devices of all processes then form one
mesh; each process feeds only its rows of every global batch (`local_rows`), and process 0 alone writes
(`is_writer`). The output directory must be one that every process sees (a shared filesystem).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import socket
import time

import keras
import numpy as np

from keras_tfm.errors import InputError


class ProcessLost(RuntimeError):
    """Another process of a multi-process run stopped (killed, crashed, or its host went away)."""


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's place in the run: `index` in `[0, count)`; process 0 writes."""

    index: int = 0
    count: int = 1
    engine: str = "none"  # "jax" (jax.distributed) or "tf_config" (MultiWorkerMirroredStrategy)


_processes = Processes()
_strategy = None  # TensorFlow's MultiWorkerMirroredStrategy, made once, before any other TensorFlow op


def processes() -> Processes:
    return _processes


def worker_strategy():
    """TensorFlow's MultiWorkerMirroredStrategy of a run of several workers (`None` otherwise)."""
    return _strategy


def is_writer() -> bool:
    """Whether this process writes the run's files (logs, checkpoints, metrics, exports): process 0."""
    return _processes.index == 0


@contextlib.contextmanager
def alone():
    """A block that one process runs by itself (writing the run's files). On JAX every variable made under
    a distribution of several processes is made by all of them together (Keras' saving makes one), so the
    block runs without the distribution; it only reads the weights, a whole copy of which every process has."""
    if _processes.engine != "jax":
        yield
        return
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def log(message: str) -> None:
    """Prints `message` from process 0 (the only one, unless the run has several)."""
    if is_writer():
        print(message, flush=True)


def local_rows(batch_size: int) -> slice:
    """This process's rows of a global batch of `batch_size` rows (all of them with one process)."""
    share = batch_size // _processes.count
    return slice(_processes.index * share, (_processes.index + 1) * share)


def process_settings(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> tuple:
    """(coordinator_address, num_processes, process_id) from the arguments, else from Keras'
    `KERAS_DISTRIBUTION_JOB_ADDRESSES` / `_NUM_PROCESSES` / `_PROCESS_ID`, else from `JAX_COORDINATOR_ADDRESS`,
    `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`; (None, None, None) for a single process."""
    environment = os.environ
    for prefix, address_name in (("KERAS_DISTRIBUTION_", "JOB_ADDRESSES"), ("JAX_", "COORDINATOR_ADDRESS")):
        coordinator_address = coordinator_address or environment.get(prefix + address_name)
        for name, value in (("num_processes", num_processes), ("process_id", process_id)):
            text = environment.get(prefix + name.upper())
            if value is None and text is not None:
                try:
                    value = int(text)
                except ValueError:
                    raise InputError(f"expected an integer in ${prefix}{name.upper()}; got {text!r}.", name) from None
                num_processes, process_id = (value, process_id) if name == "num_processes" else (num_processes, value)
    if coordinator_address and "," in coordinator_address:  # Keras' list of every job's address: the first coordinates
        coordinator_address = coordinator_address.split(",")[0]
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    if all(value is None for value in given.values()) or (num_processes == 1 and not process_id):
        return None, None, None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise InputError(
            "a run of several processes needs the coordinator's address, the number of processes and this "
            f"process's index; `{missing[0]}` is missing.",
            missing[0],
        )
    if not isinstance(num_processes, int) or num_processes < 1:
        raise InputError(f"expected an integer >= 1; got {num_processes!r}.", "num_processes")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise InputError(
            f"expected an integer in [0, {num_processes}) (`num_processes` is {num_processes}); got {process_id!r}.",
            "process_id",
        )
    host, _, port = str(coordinator_address).rpartition(":")
    if not host or not port.isdigit():
        raise InputError(
            f"expected HOST:PORT, such as 10.0.0.1:1234; got {coordinator_address!r}.", "coordinator_address"
        )
    return coordinator_address, num_processes, process_id


def initialize_processes(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout: int = 60,
) -> Processes:
    """Joins a run of several processes (JAX), or of several TensorFlow workers when `TF_CONFIG` names
    more than one; call before the backend first touches a device. Returns this process's place.

    Args:
        coordinator_address: `HOST:PORT` of process 0, which every process reaches.
        num_processes: processes in the run.
        process_id: this process's index in `[0, num_processes)`; process 0 coordinates and writes.
        timeout: seconds to wait for all processes to join, and after which a process that stopped
            answering counts as lost.

    The arguments may come from the environment instead (see `process_settings`). JAX's own
    `keras.distribution.initialize` is not used: it takes no timeouts, and a process whose peer never
    comes would wait five minutes before failing, one whose peer dies, 100 seconds.
    """
    global _processes
    coordinator_address, num_processes, process_id = process_settings(coordinator_address, num_processes, process_id)
    backend = keras.backend.backend()
    if num_processes is not None:
        if backend != "jax":
            raise InputError(
                f"several processes join with the jax backend (on tensorflow, set TF_CONFIG); not {backend}.",
                "num_processes",
            )
        import jax

        start = time.monotonic()
        if process_id != 0:  # jaxlib ends the process, without saying why, when the coordinator never answers
            _wait_for_coordinator(coordinator_address, process_id, num_processes, timeout)
        # Without it the coordinator aborts every process once a lost one misses its heartbeats, often
        # before the failed collective lets this process name the lost one and exit cleanly.
        recoverable = jax.config.jax_enable_recoverability
        jax.config.update("jax_enable_recoverability", True)
        try:
            jax.distributed.initialize(
                coordinator_address,
                num_processes,
                process_id,
                initialization_timeout=timeout,
                heartbeat_timeout_seconds=max(5, timeout // 2),
                shutdown_timeout_seconds=max(5, timeout // 2),
            )
        except Exception as error:  # jaxlib raises its own XlaRuntimeError (a RuntimeError) or ValueError
            reason = (str(error).strip().splitlines() or [""])[0][:300]
            raise InputError(
                f"process {process_id} of {num_processes} could not join the run at {coordinator_address!r} within "
                f"{time.monotonic() - start:.0f} s ({reason}). Start process 0 on that host and port, and every "
                "other process with the same address and number of processes.",
                "coordinator_address",
            ) from None
        finally:
            jax.config.update("jax_enable_recoverability", recoverable)
        _processes = Processes(jax.process_index(), jax.process_count(), "jax")
        atexit.register(_leave_together, _processes.index, _processes.count, timeout)  # before JAX's shutdown
    elif backend == "tensorflow" and len(_tf_config_workers()) > 1:
        import tensorflow as tf

        global _strategy
        _strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
        )
        resolver = _strategy.cluster_resolver
        _processes = Processes(int(resolver.task_id), len(_tf_config_workers()), "tf_config")
    return _processes


def _leave_together(index: int, count: int, timeout: float) -> None:
    """At exit: the processes of a JAX run wait for each other (at most `timeout` s), then process 0, which
    holds the coordinator, waits for the others to disconnect. A coordinator that tolerates lost processes
    does not hold its own shutdown for them, and a process that finds it gone while shutting down aborts."""
    from keras_tfm.compat import jax_coordination_client

    with contextlib.suppress(Exception):  # one lost or stuck: ending anyway, as the shutdown would
        jax_coordination_client().wait_at_barrier("keras_tfm_exit", int(timeout * 1000))
        if index == 0:
            _live_processes(count)  # returns once every other process has left


def _live_processes(count: int) -> list[int]:
    """The processes of a JAX run that its coordinator still hears from; returns once every live process has
    asked or left. Raises if the coordinator cannot be reached."""
    from keras_tfm.compat import jax_coordination_client

    live = jax_coordination_client().get_live_nodes(list(range(count)))
    if isinstance(live, dict):
        return sorted(int(index) for index in live)
    return sorted(int(getattr(node, "process_id", node)) for node in live)


def _wait_for_coordinator(address: str, process_id: int, num_processes: int, timeout: float) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
            return
        except OSError as error:
            if time.monotonic() > deadline:
                raise InputError(
                    f"process {process_id} of {num_processes} could not reach the coordinator at {address!r} within "
                    f"{timeout:.0f} s ({error.strerror or error}). Start process 0 on that host and port, and every "
                    "other process with the same address and number of processes.",
                    "coordinator_address",
                ) from None
            time.sleep(0.5)


def _tf_config_workers() -> list:
    text = os.environ.get("TF_CONFIG")
    if not text:
        return []
    try:
        cluster = json.loads(text)["cluster"]
        return [*cluster.get("chief", []), *cluster.get("worker", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InputError(
            'expected JSON such as {"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", '
            f'"index": 0}}}}; got {text[:200]!r}.',
            "TF_CONFIG",
        ) from None


def gather_from_processes(value: int) -> list[int]:
    """Every process's `value` (an integer), gathered on every process; `[value]` with one process."""
    return [int(v) for v in gather_arrays(np.array([int(value)], np.int32))[:, 0]]


def gather_arrays(values: np.ndarray) -> np.ndarray:
    """Every process's int32 vector `values` (the same length on each), as rows `(processes, length)`.
    int32: JAX gathers 64-bit integers as 32-bit ones unless x64 is enabled."""
    local = np.asarray(values, np.int32).reshape(-1)
    if _processes.count == 1:
        return local[None]
    if _processes.engine == "jax":
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(local, tiled=True)
    else:
        import tensorflow as tf

        def gather():
            return tf.distribute.get_replica_context().all_gather(tf.constant(local), axis=0)

        gathered = _strategy.experimental_local_results(_strategy.run(gather))[0]
    return np.asarray(gathered).reshape(_processes.count, -1)


def check_same_settings(settings: dict) -> None:
    """Refuses, on every process, a run whose processes were started with different `settings` (JSON
    values: the flags that change the result, digests of the data and the tokenizer): they would train
    one model with several optimizers or data orders, silently. Compared as digests; the values that
    differ are then gathered to name them."""
    if _processes.count == 1:
        return
    names = sorted(settings)
    texts = [json.dumps(settings[name], sort_keys=True) for name in names]
    digests = [int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1 for text in texts]
    seen = gather_arrays(np.array(digests, np.int32))
    differing = [index for index in range(len(names)) if len(set(seen[:, index].tolist())) > 1]
    if not differing:
        return
    width = 64  # bytes of each value shown
    shown = b"".join(texts[index].encode()[:width].ljust(width) for index in differing)
    values = gather_arrays(np.frombuffer(shown, np.int32)).view(np.uint8).reshape(_processes.count, len(differing), -1)
    details = []
    for column, index in enumerate(differing):
        each = [bytes(values[process, column]).decode(errors="replace").strip() for process in range(_processes.count)]
        details.append(f"`{names[index]}` " + ", ".join(f"{value} (process {p})" for p, value in enumerate(each)))
    raise InputError(
        f"the {_processes.count} processes of this run were started with different settings: {'; '.join(details)}. "
        "Start every process with the same command and data; only the process index differs."
    )


checkpoint_note = None  # the runtime sets it: () -> a sentence on the last good checkpoint, for `lost_message`


def lost_message(lost: list[int], reason: str) -> str:
    """What a process says when another of the run stopped."""
    who = f"process {', '.join(map(str, lost))}" if lost else "another process"
    note = checkpoint_note() if checkpoint_note else ""
    return (
        f"{who} of {_processes.count} stopped ({reason}); this process stops too. {note}"
        "Start the same command on every process again to resume."
    )


def lost_processes(timeout: float, error: Exception) -> list[int] | None:
    """After `error` stopped training: the processes that stopped (`[]`: one that cannot be named), or
    `None` when none did. On JAX the coordinator is asked, waiting at most `timeout` seconds for it to
    notice (its heartbeat timeout; `[0]` when the coordinator itself is gone); on TensorFlow the
    collective's error names the worker it lost."""
    if _processes.engine == "tf_config":
        text = str(error)
        if not re.search(r"Collective ops is aborted|Socket closed|UNAVAILABLE|[Uu]navailable|heartbeat", text):
            return None
        remote = re.findall(r"remote target /job:\w+/replica:\d+/task:(\d+)", text)
        named = remote or re.findall(r"/job:\w+/replica:\d+/task:(\d+)", text)  # this worker's own ops too
        return sorted({int(task) for task in named} - {_processes.index})
    if _processes.engine != "jax":
        return None
    everyone = set(range(_processes.count))
    deadline = time.monotonic() + timeout
    while True:
        try:
            lost = sorted(everyone - set(_live_processes(_processes.count)))
        except Exception:  # the coordination service runs in process 0
            return [0] if _processes.index != 0 else None
        if lost or time.monotonic() > deadline:
            return lost or None
        time.sleep(1.0)


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
            distribution = keras.distribution.DataParallel(devices=devices)
            log(f"Distribution: JAX DataParallel over {len(devices)} devices{_of_processes()}.")
        else:
            import jax

            local = jax.local_device_count()
            model_axis = model_parallel or (local if _processes.count > 1 else len(devices))
            if _processes.count > 1 and local % model_axis:
                # Process 0 writes the checkpoints from the shards it holds: each needs the whole model.
                raise InputError(
                    f"with several processes the 'model' axis stays within one process's {local} devices "
                    f"(a divisor of {local}); got {model_axis}.",
                    argument="model_parallel",
                )
            if len(devices) % model_axis:
                raise InputError(
                    f"must divide the {len(devices)} devices; got {model_axis}.", argument="model_parallel"
                )
            mesh = keras.distribution.DeviceMesh((len(devices) // model_axis, model_axis), ["batch", "model"], devices)
            distribution = keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")
            log(f"Distribution: JAX ModelParallel, mesh {mesh.shape} (batch, model){_of_processes()}.")
        distribution.auto_shard_dataset = False  # each process feeds its own rows (`local_rows`)
        keras.distribution.set_distribution(distribution)
        return contextlib.nullcontext()
    if backend == "tensorflow":
        if distribute == "model":
            raise InputError(
                'model parallelism ("model") is implemented on the jax backend; use "data" on tensorflow.',
                argument="distribute",
            )
        if _strategy is not None:
            log(
                f"Distribution: TensorFlow MultiWorkerMirroredStrategy over {_strategy.num_replicas_in_sync} "
                f"devices{_of_processes()}."
            )
            return _strategy.scope()
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


def _of_processes() -> str:
    if _processes.count == 1:
        return ""
    return f" of {_processes.count} processes (this is process {_processes.index})"
