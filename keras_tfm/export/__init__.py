"""Exporting zoo models: the formats and how they are written (`formats`), the decoding loop and cached
step as functions of tensors for exported endpoints (`decoding`), and what tf2onnx is taught
(`onnx_ops`). Each model's `export` resolves its own signature and settings and delegates here."""
