"""`keras_tfm.generation.compiled`: what is kept of the programs it compiles."""

import os

import keras

from keras_tfm.generation import compiled


def test_compiled_programs_are_kept_where_asked_on_jax_only(tmp_path, monkeypatch):
    """JAX's directory of compiled programs becomes the one given, unless `$JAX_COMPILATION_CACHE_DIR` names one;
    the other backends keep none (JAX writes and reads the files: `benchmarks/warm_up.py` measures a restart)."""
    if keras.backend.backend() != "jax":
        assert compiled.keep_compiled_programs(str(tmp_path)) is None
        return
    import jax

    before = jax.config.jax_compilation_cache_dir
    try:
        assert compiled.keep_compiled_programs(str(tmp_path)) == os.environ["JAX_COMPILATION_CACHE_DIR"]  # the tests'
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        assert compiled.keep_compiled_programs(str(tmp_path)) == str(tmp_path) == jax.config.jax_compilation_cache_dir
        assert compiled.keep_compiled_programs(None) is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
