"""A device's log through the standard :mod:`logging` module: human text or one JSON object a line.

The device's events (``welcome``, ``round_done``, ``reconnect`` ...) are log records of the
``edgetrain.device`` logger carrying the event's name and fields, so one handler writes them and
the library's own messages alike, to standard error or a file, at the level the user chose. Text
lines read as sentences or ``key=value`` pairs, never as Python reprs; JSON lines are
``{"time", "level", "event", ...fields}`` (or ``"message"`` for a plain record).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["EVENT_LOGGER", "JsonFormatter", "configure_logging", "describe", "event_logger"]

#: The logger a device's events go to.
EVENT_LOGGER = "edgetrain.device"

_WARNING_EVENTS = {"reconnect", "aborted"}


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ",".join(_value(i) for i in v) or "-"
    if isinstance(v, dict):
        return ",".join(f"{k}:{_value(i)}" for k, i in v.items()) or "-"
    return str(v)


def describe(kind: str, fields: dict[str, Any]) -> str:
    """One readable line for an event: a sentence for the ones a person watches for, else ``kind key=value ...``."""
    f = fields
    if kind == "reconnect":
        return (f"server {f.get('server', '')} unreachable ({f.get('error', '')}); "
                f"retry {f.get('attempt')} in {float(f.get('delay_s', 0.0)):.1f} s")
    if kind == "bundle_mismatch":
        return str(f.get("message", ""))
    if kind == "welcome":
        return f"joined as {f.get('role')} at split {f.get('split')}"
    if kind == "run_over":
        return (f"the run is over after {f.get('rounds')} rounds here; looking for the next run in "
                f"{float(f.get('next_check_s', 0.0)):.1f} s")
    rest = " ".join(f"{k}={_value(v)}" for k, v in fields.items() if k != "device")
    return f"{kind} {rest}".rstrip()


class JsonFormatter(logging.Formatter):
    """``{"time": ISO 8601 UTC, "level", "event", ...fields}`` for an event, ``"message"`` otherwise."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            out["event"] = event
            out.update(getattr(record, "fields", {}))
        else:
            out["logger"] = record.name
            out["message"] = record.getMessage()
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(fmt: str = "text", file: str = "", level: str = "info", *,
                      stream: TextIO | None = None) -> logging.Handler:
    """Send the ``edgetrain`` loggers' records to ``file`` (appended) or ``stream`` (standard error),
    as ``fmt`` ("text" or "json"), from ``level`` up. Returns the handler (a caller may remove it)."""
    handler: logging.Handler = (logging.FileHandler(file, encoding="utf-8") if file
                                else logging.StreamHandler(stream or sys.stderr))
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("edgetrain")
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    return handler


def event_logger(logger: logging.Logger | None = None) -> Callable[[str, dict], None]:
    """An ``on_event`` callback for :class:`~edge_sdk.client.DeviceClient` that logs each event."""
    log = logger or logging.getLogger(EVENT_LOGGER)

    def on_event(kind: str, fields: dict) -> None:
        level = logging.WARNING if kind in _WARNING_EVENTS else logging.INFO
        log.log(level, "%s", describe(kind, fields), extra={"event": kind, "fields": fields})

    return on_event
