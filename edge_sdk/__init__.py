"""edge_sdk: the device side of edgetrain.

Kept lean so it can ship to phones and boards: importing this package imports neither torch
nor onnx. Torch loads only in :mod:`edge_sdk.trainer` (a device that trains with torch) and in
:mod:`edge_sdk.models` (the model zoo, used by the server and by torch-training devices).
"""

__version__ = "0.1.0"
