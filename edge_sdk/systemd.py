"""The systemd unit that runs a device as a service on a board.

``python -m edge_sdk install-service --config /etc/edgetrain/device.toml --user edgetrain`` writes
a unit that starts the device at boot once the network is up, restarts it when it fails, and runs
it as an unprivileged user with a read-only view of the system (its state, logs and activations
go to /var/lib/edgetrain, /var/log/edgetrain and a private /tmp). A wrong config file or a server
that refused the device (exit statuses 2 and 3) is not restarted: that needs a person.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

__all__ = ["service_unit", "install_service"]


def service_unit(config: str | Path, *, user: str = "edgetrain", python: str | Path | None = None,
                 description: str = "edgetrain device: on-device federated training") -> str:
    """The unit file's text for a device run with ``config`` by ``python`` as ``user``."""
    if user in ("root", "0"):
        raise ValueError("a device runs as an unprivileged user, not root")
    if not user or any(c.isspace() for c in user):
        raise ValueError(f"not a user name: {user!r}")
    interpreter = Path(python or sys.executable).absolute()
    conf = Path(config).absolute()
    return f"""[Unit]
# Written by python -m edge_sdk install-service; see docs/device-guide.md of edgetrain.
Description={description}
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User={user}
ExecStart={interpreter} -m edge_sdk --config {conf}
Restart=on-failure
RestartSec=10
# 2: a bad option, config file or data source; 3: the server refused the device. Fix, then restart.
RestartPreventExitStatus=2 3
Environment=PYTHONUNBUFFERED=1
StateDirectory=edgetrain
LogsDirectory=edgetrain
WorkingDirectory=/var/lib/edgetrain
PrivateTmp=yes
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only

[Install]
WantedBy=multi-user.target
"""


def install_service(argv: Sequence[str], *, prog: str = "python -m edge_sdk install-service") -> int:
    """Write the unit (to ``--output``, else standard output); 2 with one line for a bad option."""
    import typer

    status = [0]

    def install(
        config: Path = typer.Option(..., "--config", help="the device's config file, as the service will read it"),
        user: str = typer.Option("edgetrain", "--user", help="unprivileged user the device runs as"),
        output: Optional[Path] = typer.Option(None, "--output", "-o",
                                              help="write the unit here, e.g. /etc/systemd/system/"
                                                   "edgetrain-device.service (default: standard output)"),
        python: Optional[Path] = typer.Option(None, "--python", help="interpreter with edge_sdk installed "
                                                                     "(default: this one)"),
    ) -> None:
        """Write a systemd unit that runs this device at boot, restarts it on failure, as USER."""
        if not config.is_file():
            status[0] = _error(f"--config: no file at {config}")
            return
        try:
            text = service_unit(config, user=user, python=python)
        except ValueError as e:
            status[0] = _error(f"--user: {e}")
            return
        if output is None:
            sys.stdout.write(text)
            return
        from edge_sdk.fileio import atomic_write

        atomic_write(output, text.encode())
        print(f"wrote {output}; enable it with: systemctl daemon-reload && systemctl enable --now {output.name}",
              file=sys.stderr)

    app = typer.Typer(add_completion=False)
    app.command(epilog="Example: sudo python -m edge_sdk install-service --config /etc/edgetrain/device.toml "
                       "--user edgetrain -o /etc/systemd/system/edgetrain-device.service")(install)
    try:
        typer.main.get_command(app).main(args=list(argv), prog_name=prog, standalone_mode=False)
    except typer.TyperException as e:
        return _error(f"{e.format_message() if hasattr(e, 'format_message') else e} (see {prog} --help)")
    except OSError as e:
        return _error(f"--output: cannot write it: {e.strerror or e}")
    return status[0]


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
