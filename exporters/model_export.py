"""The trained model as an app ships it: the whole layered model as one ONNX model for inference.

The model is blocks [0, L) exported as every frozen chunk is (:func:`~exporters.onnx_export.export_chunk`):
eval mode (BatchNorm on its running statistics), a dynamic batch axis, self-contained bytes (no
external weights file, so it loads from bytes), and checked against torch on sample batches of two
sizes before it is returned. Its input is ``input`` (a batch of samples), its output ``output`` (the
model's raw outputs: logits for a classifier).

What the model is travels with it: each entry of ``metadata`` becomes one of the ONNX model's
``metadata_props``, its value the entry as JSON, which ONNX Runtime hands an app as
``InferenceSession(...).get_modelmeta().custom_metadata_map`` (:func:`read_metadata` decodes it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass

import onnx
import torch

from edge_sdk.models.layered import LayeredModel
from exporters.onnx_export import INPUT_NAME, OUTPUT_NAME, ExportSettings, export_chunk, verify_chunk

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "PRODUCER", "ExportedModel", "export_model", "merged_model",
           "metadata_props", "read_metadata"]

PRODUCER = "edgetrain"


@dataclass(frozen=True)
class ExportedModel:
    """The ONNX bytes, and the largest difference between ONNX Runtime and torch the check found."""

    onnx: bytes
    max_abs_diff: float


def metadata_props(metadata: Mapping[str, object]) -> dict[str, str]:
    """``metadata`` as ONNX metadata properties: each key with its value as JSON text."""
    return {str(k): json.dumps(v, sort_keys=True, allow_nan=False) for k, v in metadata.items()}


def read_metadata(props: Mapping[str, str]) -> dict[str, object]:
    """The metadata of an exported model, from its properties (ONNX Runtime's ``custom_metadata_map``,
    or ``{p.key: p.value for p in model.metadata_props}``)."""
    return {k: json.loads(v) for k, v in props.items()}


def merged_model(model: LayeredModel) -> LayeredModel:
    """``model`` with every LoRA adapter merged into its layer and gone (LoRA Section 4.1: W' = W +
    (alpha / r) B A, the same function without the adapter's matmuls): a copy whose adapted layers
    are plain ``nn.Linear`` of the same names, named as the model without its ``rank`` option
    (``build_model`` of that name loads its state dict). A model without adapters is returned as it is."""
    from torch import nn

    from edge_sdk.models.adapters import AdaptedLinear, has_adapters
    from edge_sdk.models.zoo import option_dropped

    if not has_adapters(model):
        return model
    merged = copy.deepcopy(model)
    for path, module in list(merged.named_modules()):
        if not isinstance(module, AdaptedLinear) or not module.rank:
            continue
        plain = nn.Linear(module.in_features, module.out_features)
        with torch.no_grad():
            plain.weight.copy_(module.weight + module.scale * (module.lora_b @ module.lora_a))
            plain.bias.copy_(module.bias)
        parent, _, attr = path.rpartition(".")
        setattr(merged.get_submodule(parent), attr, plain)
    merged.name = option_dropped(model.name, "rank")
    return merged.eval()


def export_model(model: LayeredModel, metadata: Mapping[str, object], *,
                 settings: ExportSettings = ExportSettings(), version: int = 0) -> ExportedModel:
    """The whole of ``model`` as self-contained ONNX bytes carrying ``metadata`` (JSON-ready values)
    in its ``metadata_props``, ``version`` as its ``model_version`` (the round); the bytes with their
    metadata are what is checked against torch.

    Raises :class:`~exporters.onnx_export.ExportError` when the export fails or ONNX Runtime
    disagrees with torch beyond ``settings.tolerance``.
    """
    proto = onnx.load_from_string(export_chunk(model, 0, len(model), settings=settings))
    onnx.helper.set_model_props(proto, metadata_props(metadata))
    proto.producer_name = PRODUCER
    proto.model_version = int(version)
    proto.doc_string = f"{model.name}: the whole model for inference ({INPUT_NAME} -> {OUTPUT_NAME})"
    data = proto.SerializeToString()
    worst = verify_chunk(model, 0, len(model), data, tolerance=settings.tolerance, batch_size=settings.verify_batch)
    return ExportedModel(data, worst)
