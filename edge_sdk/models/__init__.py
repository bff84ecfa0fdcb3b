"""The model zoo: layered models both the server and torch-training devices import.

Importing this package imports torch; devices that only run frozen ONNX chunks never import it.
"""

from edge_sdk.models.layered import LayeredModel
from edge_sdk.models.zoo import MODEL_NAMES, ModelSpec, build_model, model_spec

__all__ = ["LayeredModel", "MODEL_NAMES", "ModelSpec", "build_model", "model_spec"]
