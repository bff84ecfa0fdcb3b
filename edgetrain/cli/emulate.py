"""``edgetrain emulate --fleet FILE``: a fleet file's devices against a local orchestrator.

The fleet's ``emulation.mode`` and ``--backend`` (where the devices run: ``local``, ``ray``...) pick
one emulation backend of the table (:mod:`emulator.backends`; this command names none of them). In
the table today: ``processes``, one OS process per device, held to its class's memory budget and CPU
share (``emulator.supervisor``); ``lightweight``, many uncapped devices sharing a few worker
processes, for fleets of hundreds of devices (``emulator.lightweight``); and ``--backend ray``, a
lightweight fleet's workers as Ray actors on a local Ray instance or a cluster
(``emulator.ray_backend``). Each backend declares its own options (``--workers``, ``--address``,
``--rss-guard``...), which this command offers with the backends that take them in their help; an
option given for a backend that does not take it is refused before anything starts.

The run writes ``metrics.json`` (the mode and backend, per round, and per device: cap mechanism,
peak memory against budget, how each process ended, time per phase per round; with shared workers
also each worker's memory and CPU, and its host on a cluster), ``accuracy.png`` and ``memory.png``.

``--resume RUN_DIR`` continues an interrupted run in its folder: the orchestrator reloads the checkpoint
of the last round its store completed and runs the rounds after it (same fleet, strategy and seed;
the store refuses another), then writes the report over every round. ``--strategy`` overrides the
fleet's ``[training] strategy`` (its ``[strategy]`` options then apply only if the name is the same).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from edgetrain.cli import app

if TYPE_CHECKING:
    from rich.console import Console

    from emulator.backend import EmulationBackend
    from emulator.fleet import Fleet
    from emulator.recorder import EmulationRun
    from orchestrator.config import ServerConfig
    from orchestrator.views.fleetview import FleetView


def _with_backend_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with an option for each option of the emulation backends (``--workers``,
    ``--address``...), declared by the backends themselves (:mod:`emulator.backends`); the chosen
    backend's are handed to it, and one it does not take is refused (:func:`_backend_choice`)."""
    from emulator.backends import backend_options, takers

    signature = inspect.signature(command)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    for option in backend_options().values():
        params.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[option.type],
                                        default=typer.Option(None, option.flags,
                                                             help=f"{option.help}; for {takers(option.name)}")))
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return command


def _backend_help() -> str:
    from emulator.backends import EMULATION_BACKENDS, where_choices

    needs = {b.where: b.install for b in EMULATION_BACKENDS.values() if b.install}
    return ("Where the devices run: " + ", ".join(f"'{w}'" + (f" (needs {needs[w]})" if w in needs else "")
                                                   for w in where_choices())
            + "; with the fleet's emulation.mode, it picks the emulation backend.")


@app.command(epilog="Examples: edgetrain emulate --fleet tiny-capped; edgetrain emulate --fleet my-fleet.toml --rounds 10 --data-root ../datasets")
@_with_backend_options
def emulate(
    fleet: str = typer.Option(..., "--fleet", help="A fleet file, or the name of one in profiles/fleets."),
    rounds: Optional[int] = typer.Option(None, help="Rounds (default: the fleet's training.rounds)."),
    out: Path = typer.Option(Path("runs"), help="Where runs/<timestamp>/ is written."),
    data_root: Optional[str] = typer.Option(
        None, help="Folder holding the research datasets (default: the fleet's [fleet] data_root, else "
                   "$EDGETRAIN_DATA); digits and the synthetic sets need none."),
    deadline: float = typer.Option(120.0, help="Seconds after which a round closes without its stragglers."),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue the interrupted run in this folder (runs/<timestamp>) after the last round its "
                               "store completed; give the same --fleet, --strategy and --rounds."),
    strategy: Optional[str] = typer.Option(None, help="Override the fleet's [training] strategy (e.g. width)."),
    backend: str = typer.Option("local", help=_backend_help()),
    **options: Any,
) -> None:
    """Run every device of FILE (capped processes, or the lightweight mode's shared workers); report the run."""
    from edgetrain.cli import console as wide_console
    from emulator.backend import EmulationFailed
    from emulator.fleet import FleetError, load_fleet
    from emulator.runner import run_emulation
    from orchestrator.views.fleetview import FleetView
    from orchestrator.views.report import new_run_dir

    console = wide_console()
    try:
        spec = load_fleet(fleet)
    except FleetError as e:
        raise typer.BadParameter(str(e), param_hint="--fleet") from None
    chosen, given = _backend_choice(spec, backend, options, rounds=rounds, resume=resume)
    data_root = _data_root(spec, data_root)
    run_dir = resume if resume is not None else new_run_dir(out)
    config, done = _server_config(spec, run_dir, rounds=rounds, data_root=data_root, deadline=deadline,
                                  strategy=strategy, resume=resume is not None)
    config = chosen.server_settings(config, given)
    devices = spec.devices()
    console.print(f"[bold]edgetrain emulate[/]: fleet {spec.name} ({spec.model} on {spec.dataset}), "
                  f"{len(devices)} devices, {config.rounds} rounds, {chosen.describe(spec, config, given)}; "
                  f"writing {run_dir}" + (f"; resuming after round {done}" if resume is not None else ""))
    t0 = time.monotonic()
    with FleetView(console, rounds=config.rounds, devices=len(devices)) as view:
        try:
            run = asyncio.run(run_emulation(spec, config, backend=backend, specs=devices,
                                            on_event=_printer(console, view, chosen), data_root=data_root,
                                            stderr_dir=run_dir / "logs", **given))
        except EmulationFailed as e:  # a worker died; a backend's requirement missing, or its cluster not reachable
            console.print(str(e), style="red", markup=False)
            raise typer.Exit(1) from None
    _report(console, spec, config, run, run_dir, wall=time.monotonic() - t0, fleet_file=str(spec.path or fleet),
            chosen=chosen, given=given)


def _backend_choice(spec: Fleet, backend: str, options: Mapping[str, Any], *, rounds: int | None,
                    resume: Path | None) -> tuple[type[EmulationBackend], dict[str, Any]]:
    """The backend of the fleet's mode at `backend`, and the options given for it; flags that do
    not apply to it, or values it cannot take, refused before anything starts."""
    from edge_sdk.values import SettingError
    from emulator.backends import backend_options, emulation_backend, takers

    if rounds is not None and rounds < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--rounds")
    try:
        chosen = emulation_backend(spec.emulation.mode, backend)
    except ValueError as exc:
        raise typer.BadParameter(f"{spec.name}: {exc}", param_hint="--backend") from None
    flags = backend_options()
    given = {name: value for name, value in options.items() if value is not None}
    for name in given:
        if name not in chosen.option_names():
            option = flags[name]
            raise typer.BadParameter(f"{option.absent or 'applies to ' + takers(name)}; {spec.name} runs on the "
                                     f"{chosen.name} emulation backend ({chosen.summary})", param_hint=option.flags)
    problem = chosen.missing()
    if problem is not None:
        raise typer.BadParameter(f"{spec.name}: {problem}", param_hint="--backend")
    try:
        chosen.validate(spec, given)
    except SettingError as exc:
        raise typer.BadParameter(exc.problem, param_hint=exc.name) from None
    if resume is not None and not (resume / "store").is_dir():
        raise typer.BadParameter(f"{resume} holds no run (no store/ folder)", param_hint="--resume")
    return chosen, given


def _data_root(spec: Fleet, given: str | None) -> str | None:
    """The data root of the run: --data-root, else the fleet's, else None ($EDGETRAIN_DATA, read where a
    dataset loads); refused in one line, before anything starts, when the fleet's dataset is not there."""
    from edge_sdk.data import DatasetUnavailable, locate_dataset

    root = given or spec.data_root
    try:
        locate_dataset(spec.dataset, root)
    except DatasetUnavailable as e:
        raise typer.BadParameter(str(e), param_hint="--data-root") from None
    return root


def _server_config(spec: Fleet, run_dir: Path, *, rounds: int | None, data_root: str | None, deadline: float,
                   strategy: str | None, resume: bool) -> tuple[ServerConfig, int]:
    """The orchestrator's settings for the fleet (``--strategy`` replacing its strategy, with those of the
    fleet's [strategy] options the new one also takes, e.g. a paper fleet's ``max_weight_share``), and
    the rounds its store already completed (resuming)."""
    from emulator.runner import completed_rounds
    from emulator.schedule import server_config
    from orchestrator.strategies import strategy_class
    from orchestrator.strategies.options import option_specs

    config = server_config(spec, rounds=rounds, store_dir=run_dir / "store", data_root=data_root, deadline_s=deadline)
    if strategy is not None and strategy != config.strategy:
        try:
            takes = option_specs(strategy_class(strategy))
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--strategy") from None
        kept = {k: v for k, v in config.strategy_options.items() if k in takes}
        config = dataclasses.replace(config, strategy=strategy, strategy_options=kept)
    config = _strategy_settings(spec, config)
    if not resume:
        return config, 0
    return dataclasses.replace(config, resume=True), completed_rounds(config.store_dir)


def _strategy_settings(spec: Fleet, config: ServerConfig) -> ServerConfig:
    """The server settings the strategy needs (``Strategy.server_settings``) where the fleet's [training]
    table left the default, said in one line each."""
    from orchestrator.strategies.server_settings import apply_server_settings

    given: set[str] = set()
    if spec.path is not None:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]

        given = set(tomllib.loads(spec.path.read_text()).get("training", {}))
    config, notes = apply_server_settings(config, given, lambda name: f"training.{name}")
    for line in notes:
        typer.echo(f"edgetrain emulate: {line}", err=True)
    return config


def _printer(console: Console, view: FleetView, chosen: type[EmulationBackend]) -> Callable[[str, dict], None]:
    """The run's event handler: the live view, plus a line for each device that ended unexpectedly."""
    # Planned vanishings of hundreds of devices sharing workers are counted in the summary instead.
    quiet = ("finished", "stopped", "dropped") if chosen.shared_workers else ("finished", "stopped")

    def on_event(kind: str, data: dict) -> None:
        view.on_event(kind, data)
        if kind == "emulator:exit" and data.get("ended") not in quiet:
            where = f" in round {data['round']}" if data.get("round") else ""
            by = f" by {data['killed_by']}" if data.get("killed_by") else ""
            how = f"rc {data['returncode']}" if data.get("returncode") is not None else f"worker {data.get('worker')}"
            error = f": {data['error']}" if data.get("error") else ""
            console.print(f"[yellow]{data['device']}[/]: {data['ended']}{by}{where} ({how}){error}")

    return on_event


def _report(console: Console, spec: Fleet, config: ServerConfig, run: EmulationRun, run_dir: Path, *, wall: float,
            fleet_file: str, chosen: type[EmulationBackend], given: Mapping[str, Any]) -> None:
    """metrics.json, the plots, and the summary tables."""
    from orchestrator.views.report import plot_accuracy, plot_memory, write_metrics

    results = run.to_dict()
    per_device = results["devices"]
    final = run.history[-1] if run.history else {}
    write_metrics(run_dir, {"fleet": spec.name, "fleet_file": fleet_file, "config": config.to_dict(),
                            "wall_s": wall, **chosen.report(given), **results, "final": final})
    acc_plot = plot_accuracy(run_dir, run.history, title=f"{spec.name}: {spec.model} on {spec.dataset}")
    mem_plot = plot_memory(run_dir, per_device, title=f"{spec.name}: peak memory per device against its budget")
    plots = [p for p in (acc_plot, mem_plot) if p]
    if chosen.shared_workers:
        _print_lightweight_summary(console, per_device, run.workers, run.history, final, wall, run_dir, plots,
                                   chosen=chosen)
    else:
        _print_summary(console, per_device, final, wall, run_dir, plots, chosen=chosen)


def _print_summary(console, devices: list[dict], final: dict, wall_s: float, run_dir: Path, plots: list[Path], *,
                   chosen: type[EmulationBackend]) -> None:
    from rich.table import Table

    mib = float(1 << 20)
    table = Table(title="devices")
    for col in ("device", "role", "split", "cap", "cpu", "status", "rounds", "peak MiB", "peak RSS MiB",
                "budget MiB", "fwd s", "train s"):
        table.add_column(col, justify="left" if col in ("device", "role", "cap", "cpu", "status") else "right")
    for d in devices:
        rounds = d["rounds"]
        fwd = sum(r.get("forward_s") or 0 for r in rounds) / len(rounds) if rounds else 0.0
        train = sum(r.get("train_s") or 0 for r in rounds) / len(rounds) if rounds else 0.0
        status = d["status"]
        last = d["lives"][-1] if d["lives"] else {}
        if last.get("killed_by") and status != "stopped":
            status += f" ({last['killed_by']}, round {last.get('round')})"
        cpu = f"{d['cpu_share']:.2f} ({d['cpu_mechanism']})" if d["cpu_share"] is not None else d["cpu_mechanism"]
        table.add_row(d["device"], d["role"], str(d["split"]), d["mechanism"], cpu, status, str(d["rounds_reported"]),
                      f"{(d['peak_bytes'] or 0) / mib:.0f}", f"{(d['peak_rss_bytes'] or 0) / mib:.0f}",
                      f"{d['budget_bytes'] / mib:.0f}", f"{fwd:.2f}", f"{train:.2f}")
    console.print(table)
    console.print(f"mode: {chosen.mode} ({chosen.summary})")
    _print_done(console, final, wall_s, run_dir, plots)


def _print_lightweight_summary(console, devices: list[dict], workers: list[dict], history: list[dict], final: dict,
                               wall_s: float, run_dir: Path, plots: list[Path], *,
                               chosen: type[EmulationBackend]) -> None:
    """Hundreds of devices: one row per group, then the worker processes and the rounds."""
    from rich.table import Table

    mib = float(1 << 20)
    groups: dict[str, list[dict]] = {}
    for d in devices:
        groups.setdefault(d["group"], []).append(d)
    table = Table(title="device groups")
    for col in ("group", "devices", "role (split)", "finished", "dropped lives", "failed", "rounds reported"):
        table.add_column(col, justify="left" if col in ("group", "role (split)") else "right")
    for name, members in groups.items():
        roles: dict[str, int] = {}
        for d in members:
            key = f"{d['role']} ({d['split']})"
            roles[key] = roles.get(key, 0) + 1
        lives = [life for d in members for life in d["lives"]]
        table.add_row(name, str(len(members)), ", ".join(f"{n} {k}" for k, n in roles.items()),
                      str(sum(d["status"] in ("finished", "stopped") for d in members)),
                      str(sum(life["ended"] == "dropped" for life in lives)),
                      str(sum(life["ended"] == "failed" for life in lives)),
                      str(sum(d["rounds_reported"] for d in members)))
    console.print(table)
    hosts = any("host" in w for w in workers)  # workers placed on a cluster's nodes say where
    wt = Table(title=chosen.workers_called)
    for col in ("worker", *(("host",) if hosts else ()), "pid", "devices", "RSS before devices MiB", "peak RSS MiB",
                "CPU s", "exit"):
        wt.add_column(col, justify="right")
    for w in workers:
        wt.add_row(str(w["index"]), *((str(w.get("host")),) if hosts else ()), str(w["pid"]), str(w["devices"]),
                   f"{(w['rss_ready_bytes'] or 0) / mib:.0f}", f"{(w['peak_rss_bytes'] or 0) / mib:.0f}",
                   f"{w['cpu_s']:.2f}" if w["cpu_s"] is not None else "?", str(w["returncode"]))
    console.print(wt)
    rt = Table(title="rounds")
    for col in ("round", "selected", "reported", "wall s", "server CPU s", "workers CPU s"):
        rt.add_column(col, justify="right")
    for r in history:
        rt.add_row(str(r["round"]), str(r["selected"]), str(r["reported"]), f"{r['round_wall_s']:.2f}",
                   f"{r['server_cpu_s']:.2f}", f"{r['workers_cpu_s']:.2f}" if "workers_cpu_s" in r else "?")
    console.print(rt)
    console.print(f"mode: {chosen.mode} ({len(workers)} {chosen.workers_called} shared by "
                  f"{len(devices)} uncapped devices)")
    _print_done(console, final, wall_s, run_dir, plots)


def _print_done(console, final: dict, wall_s: float, run_dir: Path, plots: list[Path]) -> None:
    acc = final.get("accuracy")
    console.print(f"[bold green]done[/] in {wall_s:.1f} s: {final.get('round', 0)} rounds"
                  + (f", final accuracy [bold]{acc:.4f}[/]" if acc is not None else ""))
    console.print(f"metrics: {run_dir / 'metrics.json'}" + "".join(f"   plot: {p}" for p in plots))
