"""The server: the websockets I/O (:mod:`orchestrator.server.orchestrator`) and the parts it wires
(admission, planning, payloads, uploads, the round loop, ...; docs/architecture.md, "The server").

``Orchestrator`` is re-exported lazily: the report intake, the views and an emulated device import
single parts of the server (``evaluate``, ``uploads``, ``wirebytes``, ``limits``), and importing a
part must not load the whole server (its websockets I/O, and the intake that imports them back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.server.orchestrator import Orchestrator

__all__ = ["Orchestrator"]


def __getattr__(name: str):
    if name == "Orchestrator":
        from orchestrator.server.orchestrator import Orchestrator

        return Orchestrator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
