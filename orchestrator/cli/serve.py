"""``edgetrain serve`` and ``edgetrain device``: the two long-running halves of a deployment.

``edgetrain device`` is the device SDK's own entry point (``python -m edge_sdk``, :mod:`edge_sdk.cli`)
with ``--device-class`` added: the budgets of device classes live on the planning side (``profiles``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli import app


@app.command()
def serve(
    model: str = typer.Option("digits_mlp", help="Model from the zoo."),
    strategy: str = typer.Option("embracingfl", help="Strategy: fedavg, embracingfl, fedsubavg, fedalign, varsel, or package.module:Class for one of your own (docs/architecture.md, \"Strategies\")."),
    strategy_option: list[str] = typer.Option([], "--strategy-option", "-O", help="KEY=VALUE option of the strategy, repeatable (e.g. -O epsilon=0.3 -O warmup=5 for fedalign, -O budget=4 for varsel)."),
    rounds: int = typer.Option(20, help="Rounds to run."),
    fraction: float = typer.Option(1.0, help="Share of idle connected devices sampled per round."),
    min_devices: int = typer.Option(2, help="Connected devices to wait for before a round starts."),
    quorum: float = typer.Option(1.0, help="Share of selected devices whose updates close a round early."),
    deadline: float = typer.Option(120.0, help="Seconds after which a round closes without its stragglers."),
    local_steps: int = typer.Option(10, help="Local steps per round (tau)."),
    batch_size: int = typer.Option(32, help="Local mini-batch size."),
    lr: float = typer.Option(0.05, help="Local learning rate."),
    lr_decay_at: str = typer.Option("", help="Rounds after which the learning rate is multiplied by --lr-decay, "
                                             "comma-separated (e.g. 800,900)."),
    lr_decay: float = typer.Option(0.1, help="Factor of each --lr-decay-at step."),
    data: str = typer.Option("digits", help="Held-out dataset for evaluation."),
    data_root: Optional[str] = typer.Option(None, help="Folder holding the datasets (default: $EDGETRAIN_DATA or ../shared/datasets)."),
    eval_every: int = typer.Option(1, help="Evaluate every n rounds (0: never)."),
    store: Path = typer.Option(Path("runs/serve"), help="Folder for the SQLite journal and checkpoints."),
    resume: bool = typer.Option(False, help="Continue from the last completed round in --store."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8765),
    token: str = typer.Option("", help="Shared token every device must present (empty: none); a lab setting, "
                                       "see docs/security.md."),
    require_credentials: bool = typer.Option(False, help="Every device proves its own credential (edgetrain "
                                                          "device enroll --store ...); --token is then unused."),
    max_device_samples: int = typer.Option(100_000, help="Most samples one device's report may weigh."),
    norm_bound: float = typer.Option(0.0, help="Clip (or refuse, --norm-bound-action reject) an update whose norm "
                                              "exceeds this multiple of recent updates' median; 0: off."),
    norm_bound_action: str = typer.Option("clip", help="clip or reject, for --norm-bound."),
    round_retries: int = typer.Option(2, help="Times a round whose result fails its checks runs again from the "
                                              "last good state before it is journaled as failed."),
    max_connections: int = typer.Option(20_000, help="Connections held at once; more are refused."),
    transfer_stall: float = typer.Option(30.0, help="Seconds a transfer may make no progress before it is dropped."),
    transfer_min_rate: float = typer.Option(16 << 10, help="Bytes/s a transfer must average (after a grace "
                                                           "period) not to be dropped."),
    chunk_disk: str = typer.Option("1GiB", help="Disk kept for exported chunks in --store (oldest removed first)."),
    tls_cert: Optional[Path] = typer.Option(None, help="PEM certificate chain: serve wss:// (TLS) instead of ws://."),
    tls_key: Optional[Path] = typer.Option(None, help="Private key of --tls-cert (if not in the same file)."),
    seed: int = typer.Option(0),
) -> None:
    """Run the orchestrator: register devices, plan their splits, run rounds, checkpoint each one."""
    from orchestrator.config import ServerConfig
    from orchestrator.server import Orchestrator
    from profiles.units import parse_size

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        options = parse_strategy_options(strategy_option)
        from orchestrator.strategies import make_strategy

        make_strategy(strategy, **options)  # a bad name or option fails here, before anything listens
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--strategy / --strategy-option") from None
    try:
        decay_at = tuple(int(r) for r in lr_decay_at.split(",") if r.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated round numbers, got {lr_decay_at!r}",
                                 param_hint="--lr-decay-at") from None
    if any(r < 1 for r in decay_at):
        raise typer.BadParameter(f"round numbers must be >= 1, got {lr_decay_at!r}", param_hint="--lr-decay-at")
    if not 0.0 < lr_decay <= 1.0:
        raise typer.BadParameter(f"must be in (0, 1], got {lr_decay}", param_hint="--lr-decay")
    config = ServerConfig(
        model=model, strategy=strategy, strategy_options=options, rounds=rounds, fraction=fraction, min_devices=min_devices, quorum=quorum,
        deadline_s=deadline, local_steps=local_steps, batch_size=batch_size, lr=lr, lr_decay_at=decay_at, lr_decay=lr_decay,
        eval_data=data,
        data_root=data_root, eval_every=eval_every, store_dir=store, resume=resume, host=host, port=port,
        token=token, require_credentials=require_credentials, max_device_samples=max_device_samples,
        norm_bound=norm_bound, norm_bound_action=norm_bound_action, round_retries=round_retries,
        max_connections=max_connections, transfer_stall_s=transfer_stall, transfer_min_rate=transfer_min_rate,
        chunk_disk_bytes=parse_size(chunk_disk), seed=seed,
        tls_cert=None if tls_cert is None else str(tls_cert),
        tls_key=None if tls_key is None else str(tls_key),
    )
    if tls_key is not None and tls_cert is None:
        raise typer.BadParameter("--tls-key needs --tls-cert")
    if norm_bound_action not in ("clip", "reject"):
        raise typer.BadParameter("--norm-bound-action is clip or reject")

    def on_event(kind: str, payload: dict) -> None:
        print(json.dumps({"event": kind, **payload}, default=str), flush=True)

    history = asyncio.run(Orchestrator(config, on_event=on_event).run())
    if history:
        last = history[-1]
        typer.echo(f"finished round {last['round']}: accuracy {last.get('accuracy', float('nan')):.4f}", err=True)


def parse_strategy_options(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs as keyword options; values stay strings (each strategy converts and checks them)."""
    options: dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key.isidentifier():
            raise ValueError(f"a strategy option is KEY=VALUE, got {item!r}")
        options[key] = value.strip()
    return options


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def device(ctx: typer.Context) -> None:
    """Run one device (edgetrain device --help), or manage credentials: edgetrain device enroll|revoke|list."""
    from edge_sdk import cli as device_cli
    from profiles.devices import DeviceClassError, load_device_class

    if ctx.args and ctx.args[0] in CREDENTIAL_COMMANDS:
        credentials(ctx.args[0], ctx.args[1:])
        return

    # The device's own entry point (python -m edge_sdk), plus what only the planning side knows:
    # the budgets of device classes (--device-class).
    def class_budget(name: str) -> int:
        try:
            return load_device_class(name).budget_bytes
        except DeviceClassError as e:
            raise ValueError(str(e)) from None

    device_cli.main(ctx.args, prog="edgetrain device", device_class_budget=class_budget)


CREDENTIAL_COMMANDS = ("enroll", "revoke", "list")


def credentials(command: str, argv: list[str]) -> None:
    """``edgetrain device enroll --store DIR --id ID [--samples N] [--out FILE]``: issue a device's
    credential (its secret is printed, or written to --out, once: the store keeps only its key);
    ``revoke --store DIR --id ID``; ``list --store DIR``. The store is the server's --store folder."""
    import argparse

    from orchestrator.store import Store

    parser = argparse.ArgumentParser(prog=f"edgetrain device {command}", description=credentials.__doc__)
    parser.add_argument("--store", type=Path, required=True, help="the server's --store folder")
    if command != "list":
        parser.add_argument("--id", dest="device_id", required=True, help="the device's id")
    if command == "enroll":
        parser.add_argument("--samples", type=int, default=None,
                            help="the sample count this device's reports may weigh (default: what it declares)")
        parser.add_argument("--out", type=Path, default=None, help="write the secret to this file (mode 0600)")
    args = parser.parse_args(argv)
    with Store(args.store) as store:
        if command == "enroll":
            try:
                secret = store.enroll(args.device_id, samples=args.samples)
            except ValueError as e:
                parser.error(str(e))
            if args.out is None:
                typer.echo(secret)
            else:
                args.out.touch(mode=0o600)
                args.out.write_text(secret + "\n")
                typer.echo(f"enrolled {args.device_id}; its secret is in {args.out} (python -m edge_sdk --secret-file)",
                           err=True)
        elif command == "revoke":
            if not store.revoke(args.device_id):
                parser.error(f"{args.device_id} has no credential to revoke")
            typer.echo(f"revoked {args.device_id}", err=True)
        else:
            for c in store.credentials():
                state = "revoked" if c["revoked"] is not None else "active"
                typer.echo(f"{c['device_id']}\t{state}\tsamples={c['samples'] if c['samples'] else '-'}")
