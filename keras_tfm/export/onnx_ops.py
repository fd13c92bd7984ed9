"""What tf2onnx is taught to convert the zoo's graphs (once per process)."""

from __future__ import annotations


def teach_tf2onnx() -> None:
    """What tf2onnx lacks (once per process): `Erfc` (TensorFlow's exact GELU, `0.5 * x * erfc(-x /
    sqrt(2))`), written as `1 - Erf(x)`; and `XlaDynamicUpdateSlice` (Keras' `slice_update` on
    TensorFlow: a decoding step's cache write), written as a `ScatterND`."""
    from tf2onnx.handler import tf_op

    if any("Erfc" in handlers for handlers in tf_op.get_opsets().get("", [])):
        return
    tf_op("Erfc")(_Erfc)
    tf_op("XlaDynamicUpdateSlice")(_DynamicUpdateSlice)


class _Erfc:
    @classmethod
    def version_9(cls, ctx, node, **kwargs):
        import numpy as np
        from tf2onnx import utils

        dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
        one = ctx.make_const(utils.make_name("one"), np.array(1, dtype))
        erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
        shapes, dtypes = node.output_shapes, node.output_dtypes
        ctx.remove_node(node.name)
        ctx.make_node("Sub", [one.output[0], erf.output[0]], outputs=[node.output[0]], shapes=shapes, dtypes=dtypes)


class _DynamicUpdateSlice:
    """`update` written into `data` from `starts` (clamped so that it fits, as XLA does): a `ScatterND`
    whose indices are every position of the update, offset by the starts."""

    @classmethod
    def version_11(cls, ctx, node, **kwargs):
        import numpy as np
        from onnx import TensorProto
        from tf2onnx import utils

        data, update, starts = node.input
        rank = ctx.get_rank(update)

        def const(value):
            return ctx.make_const(utils.make_name("const"), np.array(value, np.int64)).output[0]

        def op(kind, inputs, **attributes):
            return ctx.make_node(kind, inputs, attr=attributes, op_name_scope=node.name).output[0]

        shape = op("Shape", [update])
        room = op("Sub", [op("Shape", [data]), shape])
        starts = op("Min", [op("Max", [op("Cast", [starts], to=TensorProto.INT64), const([0] * rank)]), room])
        with_one = op("Concat", [shape, const([1])], axis=0)
        coordinates = []
        for axis in range(rank):
            start = op("Gather", [starts, const(axis)])
            line = op("Range", [start, op("Add", [start, op("Gather", [shape, const(axis)])]), const(1)])
            line = op("Reshape", [line, const([-1 if i == axis else 1 for i in range(rank)])])
            coordinates.append(op("Reshape", [op("Expand", [line, shape]), with_one]))
        indices = op("Concat", coordinates, axis=rank)
        shapes, dtypes = node.output_shapes, node.output_dtypes
        ctx.remove_node(node.name)
        ctx.make_node("ScatterND", [data, indices, update], outputs=[node.output[0]], shapes=shapes, dtypes=dtypes)
