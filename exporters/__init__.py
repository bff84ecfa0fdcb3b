"""exporters: turn a layered model into what devices run (ONNX chunks, device bundles)."""
