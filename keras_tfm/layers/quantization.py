"""Quantized sub-layers in a config: what lets a quantized model or layer be saved and loaded again;
and quantizing without a garbage collection per replaced kernel."""

from __future__ import annotations

import keras

from keras_tfm.compat import child_layers, one_garbage_collection  # noqa: F401 (one_garbage_collection: public here)


def _named_sublayers(layer, prefix: str = ""):
    """Every sub-layer below `layer`, each with its path of names from there ("block_0/feed_forward")."""
    for sublayer in child_layers(layer):
        path = prefix + sublayer.name
        yield path, sublayer
        yield from _named_sublayers(sublayer, path + "/")


class QuantizationConfigMixin:
    """For layers and models made of sub-layers: their config records what `quantize(...)` changed
    in the sub-layers, so that the object made again from it takes the saved weights.

    `quantize("int8")` changes each quantized sub-layer (a `Dense` gets int8 kernels, policy
    "int8_from_float32", and a `quantization_config`), not the layer that made it, whose config
    would then rebuild float sub-layers that refuse the saved weights. After quantization, `dtype`
    in the config is a `keras.dtype_policies.DTypePolicyMap` naming each quantized sub-layer's policy
    by its path (as keras-hub's backbones do): sub-layers are made with `dtype=self.dtype_policy`,
    and each finds its own policy in the map when it builds. `quantization_configs` keeps each one's
    `quantization_config` (int4's block size, whether its inputs are quantized too, ...), given back
    to the sub-layers before they build.
    """

    def get_config(self) -> dict:
        config = super().get_config()
        policy = self.dtype_policy
        quantized = {path: layer for path, layer in _named_sublayers(self) if layer.quantization_mode}
        if quantized and not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            policy = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
            for layer in quantized.values():
                policy[layer.path] = layer.dtype_policy
        config["dtype"] = keras.dtype_policies.serialize(policy)
        quantization_configs = {
            path: keras.saving.serialize_keras_object(layer.quantization_config)
            for path, layer in quantized.items()
            if getattr(layer, "quantization_config", None) is not None
        }
        if quantization_configs:
            config["quantization_configs"] = quantization_configs
        return config

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        quantization_configs = config.pop("quantization_configs", {})
        made = super().from_config(config)
        for path, layer in _named_sublayers(made):
            if path in quantization_configs:
                layer.quantization_config = keras.saving.deserialize_keras_object(quantization_configs[path])
        return made
