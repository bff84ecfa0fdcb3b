"""What the person who starts ``edgetrain serve`` sees in the terminal.

By default, the run's progress (:class:`ServeView`: the rounds, the devices connected and reporting,
a line per round with its accuracy, loss and time, a line per refusal or error) and the server's
warnings; with ``--json-events``, the server's events as JSON lines on standard output instead (for
tools), and its log on standard error; with ``--log-file``, the events and the log as JSON lines in
a file as well (:class:`ServeOutput`). With ``--web``, the device page's address: a URL, and a QR
code a phone's camera opens (drawn with ``segno`` when it is installed, as it is with the ``server``
extra).
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

from orchestrator.views.fleetview import FleetView
from orchestrator.views.web.status import NOTICES, StatusFeed

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.config import ServerConfig
    from orchestrator.views.web.certs import LocalAuthority
    from orchestrator.views.web.install import InstallSite

__all__ = ["ServeOutput", "ServeView", "announce", "page_url", "round_line"]

#: Notices that are the server's own, not a device's refusal: shown, not counted in a round's line.
SERVER_NOTICES = ("round_failed", "train_graph_refused")


def page_url(host: str, port: int, *, tls: bool, token: str = "") -> str:
    """The device page's URL. A wildcard host is shown as this machine's address on its network; the
    token, when devices need one, rides in the fragment (the browser keeps it: it is never sent in a request)."""
    fragment = f"#token={quote(token, safe='')}" if token else ""
    return f"{'https' if tls else 'http'}://{url_host(host)}:{port}/{fragment}"


def url_host(host: str) -> str:
    """``host`` as a URL names it: a wildcard as this machine's address on its network, IPv6 bracketed."""
    if host in ("", "0.0.0.0", "::"):
        host = lan_address()
    return f"[{host}]" if ":" in host else host


def lan_address() -> str:
    """This machine's address on the network its default route leaves by (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only, nothing goes out
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def announce(url: str, stream: TextIO, *, install_url: str | None = None, fingerprint: str | None = None) -> None:
    """Print the device page's and the status page's URLs, and a QR code: of the device page, or with a
    local certificate authority (``install_url``) of the plain-http page that installs it and then
    opens the device page (docs/web.md, "A phone on the LAN")."""
    status = url.split("#", 1)[0] + "status"
    stream.write(f"device page: {url}\nstatus page: {status}\n")
    if install_url is not None:
        stream.write(f"a phone trusts this server once it installs its local certificate authority: {install_url}\n"
                     f"authority's SHA-256 fingerprint: {fingerprint}\n")
        url = install_url + (f"#{url.split('#', 1)[1]}" if "#" in url else "")
    if "//127." in url or "//[::1]" in url or "//localhost" in url:
        stream.write("(this machine only: --host 0.0.0.0 lets a phone on the same network open the page)\n")
    try:
        import segno
    except ImportError:
        stream.write("(pip install segno to show a QR code of the device page here)\n")
        return
    segno.make(url, error="m").terminal(out=stream, compact=True)
    stream.flush()


def privacy_words(privacy: Mapping[str, Any]) -> str:
    """The privacy a DP run has spent (orchestrator.aggregation.privacy.release), in a few words, with where its
    noise is added (``mode``: the server's central noise, or the devices' distributed noise)."""
    mode = f", {privacy['mode']} noise" if privacy.get("mode") else ""
    return f"epsilon {privacy['epsilon']:.4g} (delta {privacy['delta']:.3g}{mode})"


def buffer_words(m: Mapping[str, Any]) -> str:
    """A buffer's words: the version made, the staleness folded, devices still training, updates wasted."""
    words = f"version {m['model_version']}: staleness mean {float(m.get('staleness_mean', 0.0)):.1f}, " \
            f"max {m.get('staleness_max', 0)}, {m.get('in_flight', 0)} training"
    return words + (f", {m['wasted_total']} wasted" if m.get("wasted_total") else "")


def round_line(metrics: Mapping[str, Any], rounds: int, refused: int = 0) -> str:
    """One line for a finished round: reports, the server's accuracy and loss (else the devices' own
    loss), its time, stragglers, the devices paced, refusals, and why it was not committed if it was not."""
    m = metrics
    parts = [f"round {m['round']}/{rounds}", f"{m.get('reported', 0)} of {m.get('selected', 0)} reported"]
    if "accuracy" in m:
        parts.append(f"accuracy {m['accuracy']:.4f}")
    if "test_loss" in m:
        parts.append(f"loss {m['test_loss']:.4f}")
    elif "loss_after" in m:
        parts.append(f"devices' loss {m['loss_after']:.4f}")
    parts.append(f"{float(m.get('round_wall_s', 0.0)):.1f} s")
    if isinstance(m.get("privacy"), Mapping):
        parts.append(privacy_words(m["privacy"]))
    if isinstance(m.get("secure"), Mapping):
        blocks = m["secure"].get("blocks") or {}
        parts.append(f"secure: {sum(bool(b.get('revealed')) for b in blocks.values())} of {len(blocks)} blocks "
                     f"revealed, {len(m['secure'].get('recovered') or [])} dropouts recovered")
    if "model_version" in m:  # a buffered round: the version it made and what it folded (docs/buffered.md)
        parts.append(buffer_words(m))
    if m.get("stragglers"):
        parts.append(f"stragglers {', '.join(map(str, m['stragglers']))}")
    if isinstance(m.get("paced"), Mapping) and m["paced"]:  # asked for fewer steps, for their measured speed
        parts.append("paced " + ", ".join(f"{d} ({k} steps)" for d, k in m["paced"].items()))
    if refused:
        parts.append(f"{refused} refused")
    if m.get("failed"):
        parts.append(f"not committed: {m['failed']}")
    return ", ".join(parts)


class ServeView(FleetView):
    """``FleetView``'s live progress (rounds, devices connected, this round's reports) for a server, whose
    fleet is whoever connects, plus the lines a person reads afterwards: where it listens, each round,
    and each refusal or error as the status page lists them (:class:`~orchestrator.views.web.status.StatusFeed`)."""

    def __init__(self, console: Console, config: ServerConfig) -> None:
        super().__init__(console, rounds=config.rounds, devices=max(1, config.min_devices))
        self.config = config
        self.feed = StatusFeed()
        self.refused = 0  # refusals since the last round line

    def on_event(self, kind: str, data: dict) -> None:
        super().on_event(kind, data)
        self.feed.take(kind, data)
        if kind == "registered" and len(self.connected) > self.progress.tasks[self.conn_task].total:
            self.progress.update(self.conn_task, total=len(self.connected))
        line = self._line(kind, data)
        if line:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _line(self, kind: str, data: dict) -> str | None:
        if kind == "listening":
            scheme = "wss" if data.get("tls") else "ws"
            return (f"listening on {scheme}://{data['host']}:{data['port']}; store {self.config.store_dir}; "
                    f"{self.config.rounds} rounds of {self.config.model}, strategy {self.config.strategy}, "
                    f"waiting for {self.config.min_devices} devices")
        if kind == "round_end":
            refused, self.refused = self.refused, 0
            return round_line(data, self.config.rounds, refused)
        if kind == "privacy_budget_spent":
            return str(data["message"])
        if kind in NOTICES:
            self.refused += kind not in SERVER_NOTICES
            n = self.feed.notices[-1]
            at = f" (round {n.round})" if n.round is not None else ""
            return f"{n.kind.replace('_', ' ')}: {n.device or '-'}{at}: {n.message}"
        if kind == "update" and not data.get("accepted", True):
            self.refused += 1
            return f"refused: {data['device']}'s {data.get('phase')} report of round {data['round']}: {data.get('reason')}"
        if kind == "revoked":
            return f"revoked: {data['device']}'s credential; its connection is closed"
        return None


#: The server's log messages that repeat an event the view shows as a line (kept in --json-events
#: mode and in the log file): a person sees each refusal once.
SHOWN_AS_EVENTS = frozenset({
    "closing %s: %s %s", "round %d (attempt %d) not committed: %s", "training graph of split %d refused: %s",
    "device %s stopped: %s %s", "refused %s's %s report of round %d: %s",
})


class _ForTheTerminal(logging.Filter):
    """Keeps events (records carrying ``event``) off the terminal, where the view or the JSON lines
    show them, and, under the view, the messages that repeat one."""

    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "event", None) is not None:
            return False
        return not (self.view and record.msg in SHOWN_AS_EVENTS)


class ServeOutput:
    """Where ``edgetrain serve`` puts what happens (module doc); ``on_event`` is the server's event handler."""

    def __init__(self, config: ServerConfig, console: Console, *, json_events: bool, log_file: Path | None,
                 authority: LocalAuthority | None = None, install: InstallSite | None = None) -> None:
        """``authority``: a local certificate authority of ``serve --web`` (its fingerprint is announced);
        ``install``: its plain-http install page, serving beside the server (its URL is announced)."""
        from edge_sdk.cli import event_printer
        from edge_sdk.logs import event_logger

        self.config, self.console = config, console
        self.authority, self.install = authority, install
        self.view = None if json_events else ServeView(console, config)
        self._sinks = [event_printer(True) if self.view is None else self.view.on_event]
        self._file = self._log_to(log_file) if log_file is not None else None
        if self._file is not None:
            self._sinks.append(event_logger(logging.getLogger("edgetrain.server.events")))
        self._terminal_log()

    def _log_to(self, path: Path) -> logging.Handler:
        from edge_sdk.logs import JsonFormatter

        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(JsonFormatter())
        logging.getLogger("edgetrain").addHandler(handler)
        return handler

    def _terminal_log(self) -> None:
        """The log a person reads: under the view, warnings (and the server's own notes) through its
        console, so they print above the live progress; with --json-events, as before, every INFO line.

        One format for every record, the server's, a library's and Python's ``warnings`` alike: the
        handler's own (time, level, message). The view's handler writes the time and level itself, so
        its formatter is the bare message (``basicConfig`` would give it ``LEVEL:logger:message``, and
        every line would say its level twice)."""
        if self.view is None:
            handler: logging.Handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        else:
            from rich.logging import RichHandler

            handler = RichHandler(console=self.console, show_path=False, markup=False)
            handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_ForTheTerminal(self.view is not None))
        logging.captureWarnings(True)  # a library's warnings.warn: a record of logger py.warnings, not a raw line
        logging.basicConfig(level=logging.INFO if self.view is None else logging.WARNING, handlers=[handler])
        logging.getLogger("edgetrain").setLevel(logging.INFO)
        if self.config.web or self.view is not None:  # not a line per page, file or connection
            logging.getLogger("websockets.server").setLevel(logging.WARNING)

    def on_event(self, kind: str, payload: dict) -> None:
        for sink in self._sinks:
            sink(kind, payload)
        if kind == "listening" and self.config.web:
            token = "" if self.config.require_credentials else self.config.token
            install_url = None if self.install is None else f"http://{url_host(self.config.host)}:{self.install.port}/"
            announce(page_url(self.config.host, payload["port"], tls=payload["tls"], token=token), sys.stderr,
                     install_url=install_url, fingerprint=None if self.authority is None else self.authority.fingerprint)

    def __enter__(self) -> ServeOutput:
        if self.view is not None:
            self.view.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.view is not None:
            self.view.__exit__(kind, exc, tb)
        if self._file is not None:
            logging.getLogger("edgetrain").removeHandler(self._file)
            self._file.close()

    def finished(self, history: Sequence[Mapping[str, Any]]) -> None:
        """The run's last word: its final round and accuracy, and how to take the model out."""
        if not history:
            return
        last = history[-1]
        score = f": accuracy {last['accuracy']:.4f}" if "accuracy" in last else ""
        if isinstance(last.get("privacy"), Mapping):
            score += f"{',' if score else ':'} {privacy_words(last['privacy'])}"
        if self.view is None:
            sys.stderr.write(f"finished round {last['round']}{score}\n")
            return
        self.console.print(f"[bold green]done[/]: round {last['round']} of {self.config.rounds}{score}; the model: "
                           f"edgetrain export --store {self.config.store_dir}", highlight=False)
