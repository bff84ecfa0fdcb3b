"""Training a tail through its LoRA adapters (edge_sdk.models.adapters): the ``adapters`` selection.

The server sends the whole tail (the weights under adapters are needed to compute), and the
device trains only the adapters and the parameters outside adapted layers; its update holds
those, so its upload, gradients and optimizer state are the adapters' (docs/protocol.md,
"Selections"). A torch device builds its tail with the adapted weights frozen
(``build_tail(..., adapters=True)``); a device without torch trains the server's graph for it
(``TrainGraph.frozen`` lists the weights it reads but does not train).
"""

from __future__ import annotations

from edge_sdk import protocol as p
from edge_sdk.phases import SelectionKind

__all__ = ["ADAPTERS", "DEVICE_STEPS"]


def _options(ins: p.Instruction) -> dict[str, float]:
    return {"adapters": 1.0}


#: The ``adapters`` selection: the tail built with its adapted weights frozen; a graph trains it too.
ADAPTERS = SelectionKind(model_options=_options, trains_graph=True)

DEVICE_STEPS = {"selections": {"adapters": ADAPTERS}}
