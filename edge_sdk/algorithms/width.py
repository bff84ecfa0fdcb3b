"""Width reduction on the device: the ``channels`` selection (static HeteroFL, FjORD's ordered
dropout; EmbracingFL Section 4.1 and appendix 6.4; the server side is
``orchestrator/strategies/width.py``).

The server sends a leading slice of every entry and the width ratio r in ``config["width"]``; the
device builds the model at width r (``build_model(name, width=r)``: only the narrow model ever gets
storage), loads the slice and trains it as any tail, so its deltas have the slice's shapes. Training
graphs are exported for full-width models only: a slice trains with torch.
"""

from __future__ import annotations

from edge_sdk import protocol as p
from edge_sdk.phases import SelectionKind

__all__ = ["CHANNELS", "DEVICE_STEPS", "WIDTH_KEY", "instruction_width"]

#: Instruction config key of a channel selection's width ratio.
WIDTH_KEY = "width"


def instruction_width(ins: p.Instruction) -> float:
    """The width ratio a ``channels`` instruction asks the device to build its model at: its
    ``config["width"]``, in (0, 1]. Checked before any download: a bad instruction costs nothing."""
    value = ins.config.get(WIDTH_KEY)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise p.ProtocolError("malformed", f"a channels instruction needs config[{WIDTH_KEY!r}] in (0, 1], "
                                           f"got {value!r}")
    return float(value)


def _channel_options(ins: p.Instruction) -> dict[str, float]:
    return {"width": instruction_width(ins)}


#: A channel slice: the model is built at the instruction's width; torch only.
CHANNELS = SelectionKind(model_options=_channel_options, trains_graph=False)

#: This algorithm's entries for DeviceRegistry.extended.
DEVICE_STEPS = {"selections": {"channels": CHANNELS}}
