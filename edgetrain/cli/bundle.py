"""``edgetrain bundle``: write a device bundle (frozen ONNX chunks + trainable tail) to a file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from edgetrain.cli import app

if TYPE_CHECKING:
    from edge_sdk.bundle import Manifest
    from edge_sdk.models.layered import LayeredModel
    from exporters.train_export import TrainGraphCache


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@app.command()
def bundle(
    model: str = typer.Option(..., help="Model: a zoo name, or package.module:factory for one of your own (docs/models.md)."),
    out: Path = typer.Option(..., help="Bundle file to write (a .tar archive)."),
    device: Optional[str] = typer.Option(None, help="Device class whose memory budget sets the split."),
    budget: Optional[str] = typer.Option(None, help="Memory budget that sets the split, e.g. 512MiB."),
    split: Optional[int] = typer.Option(None, help="Split index k: blocks [0, k) frozen, one chunk per block."),
    batch: int = typer.Option(32, help="Training batch size the plan is made for."),
    runtime: Optional[str] = typer.Option(
        None, help="Memory the device's runtimes take, e.g. 250MiB (default: measured on this machine)."
    ),
    version: str = typer.Option("0", help="Model version recorded in the bundle and its chunk ids."),
    seed: int = typer.Option(0, help="Seed of the model's initial weights."),
    exporter: str = typer.Option("legacy", help="ONNX exporter: legacy (fast) or dynamo."),
    backend: str = typer.Option("torch", help="The device's training backend (its --backend): torch, onnxruntime "
                                              "(no torch: the bundle carries the tail's training graph, and the "
                                              "plan counts ONNX Runtime's smaller runtime), or package.module:Class."),
    graph_dir: Optional[Path] = typer.Option(
        None, help="Where verified training graphs are kept between runs (default: ~/.cache/edgetrain/train-graphs)."
    ),
    samples: int = typer.Option(0, help="Samples the device holds (its hello declares them and the server's plan "
                                        "counts them): plan as the server will."),
    rows: Optional[Path] = typer.Option(
        None, help="A FedSubAvg submodel: a JSON file mapping each sparse table entry to the rows the device's data "
                   "touches. The plan counts only those rows and the bundle carries only them."),
    chunk_codec: Optional[str] = typer.Option(
        None, help="The server's --chunk-codec: the chunks are held as it sends them (default: edgetrain serve's)."),
    graph_codec: Optional[str] = typer.Option(
        None, help="The server's --graph-codec, for the training graph (default: edgetrain serve's)."),
    download_delta: Optional[str] = typer.Option(
        None, help="The server's --download-delta: chunks held as a device rebuilds them (default: serve's)."),
) -> None:
    """Plan a split for a device (or take one), export the frozen chunks, and write a bundle.

    The plan is the server's: the largest split that fits the budget on the runtime the backend is
    planned on, and for a backend that trains from training graphs the next one down while a split's training graph fails its export check; the
    command says which split it chose and why. A device started with --bundle uses the bundle's
    chunks and training graph instead of downloading them; they are written for the server's transfer
    settings (--chunk-codec, --graph-codec, --download-delta, by default edgetrain serve's), as the
    device would hold them after downloading them.

    Example: edgetrain bundle --model digits_mlp --device pi-zero-2w --backend onnxruntime --out pi.tar
    """
    _check_plan_options(device, budget, split, runtime, batch)
    from profiles.runtime import backend_runtime

    try:
        planned = backend_runtime(backend)  # the runtime the server plans this device on
    except ValueError as exc:
        raise _fail(f"--backend: {exc}") from None
    declared = _read_rows(rows) if rows is not None else {}
    transfer = _transfer(chunk_codec=chunk_codec, graph_codec=graph_codec, download_delta=download_delta)

    from edge_sdk.models.zoo import build_model
    from exporters.bundle import write_bundle
    from exporters.onnx_export import ExportError, ExportSettings

    try:
        settings = ExportSettings(exporter=exporter)
        layered = build_model(model, seed=seed)
    except ValueError as exc:
        raise _fail(str(exc)) from None

    graph_cache = None
    if planned.needs_graph:
        from exporters.train_export import TrainGraphCache

        # Exporting and verifying a training graph takes seconds; it depends on the architecture only.
        graph_cache = TrainGraphCache(graph_dir or Path.home() / ".cache" / "edgetrain" / "train-graphs")
    split, chunks, role = _plan_chunks(layered, model, split, device=device, budget=budget, runtime=runtime,
                                       batch=batch, backend=planned.name, rows={k: len(r) for k, r in declared.items()},
                                       samples=samples, graph_cache=graph_cache)
    try:
        manifest = write_bundle(
            layered, split, chunks, out, version=version, device_class=device, role=role, settings=settings,
            train_graph=planned.needs_graph, graph_cache=graph_cache, rows=declared or None, transfer=transfer,
        )
    except (ValueError, ExportError) as exc:
        raise _fail(str(exc)) from None

    _print_manifest(out, manifest)


def _check_plan_options(device: str | None, budget: str | None, split: int | None, runtime: str | None,
                        batch: int) -> None:
    """Exactly one of --device, --budget, --split; --runtime only with a plan; a batch of at least 1."""
    given = [name for name, value in (("--device", device), ("--budget", budget), ("--split", split)) if value is not None]
    if len(given) != 1:
        raise _fail(f"give exactly one of --device, --budget, --split (got {', '.join(given) or 'none'})")
    if runtime is not None and split is not None:
        raise _fail("--runtime sets the plan for --device or --budget; --split takes no plan")
    if batch < 1:
        raise _fail(f"--batch must be at least 1, got {batch}")


def _transfer(**given: str | None) -> dict[str, str]:
    """The server transfer settings the bundle is written for: as given, else ``edgetrain serve``'s
    defaults (:class:`orchestrator.config.ServerConfig`), each checked against the values it takes."""
    import dataclasses
    import typing

    from orchestrator.config import ServerConfig

    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    hints = typing.get_type_hints(ServerConfig, include_extras=True)
    out = {}
    for name, value in given.items():
        allowed = typing.get_args(hints[name])
        out[name] = fields[name].default if value is None else value
        if out[name] not in allowed:
            raise _fail(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, got {value!r}")
    return out


def _plan_chunks(layered: LayeredModel, model: str, split: int | None, *, device: str | None, budget: str | None,
                 runtime: str | None, batch: int, backend: str, rows: dict[str, int], samples: int,
                 graph_cache: TrainGraphCache | None) -> tuple[int, list, str | None]:
    """The split, its frozen chunks and the planned role: as given (``--split``, no role), or planned for
    the device class's or the given budget on runtime ``backend`` as the server plans it (:meth:`Planning.shippable_plan`):
    a split whose training graph the export check refuses is dropped and the device planned again."""
    if split is not None:
        if not 0 <= split < len(layered):
            raise _fail(f"--split must be in [0, {len(layered)}) for {model} ({len(layered)} blocks)")
        typer.echo(f"split {split}/{len(layered)}: as given (--split)", err=True)
        return split, [(i, i + 1) for i in range(split)], None
    from profiles.devices import load_device_class
    from profiles.planner import plan_split
    from profiles.runtime import runtime_memory
    from profiles.units import parse_size

    from exporters.train_export import train_graph_refusal

    try:
        figures: Any = parse_size(runtime) if runtime is not None else None
        if device is not None:
            device_class = load_device_class(device)
            budget_bytes = device_class.budget_bytes
            if figures is None:  # the device class's own runtime figures where it has them
                figures = runtime_memory().with_overrides(device_class.runtime_overrides)
        else:
            budget_bytes = parse_size(budget)  # type: ignore[arg-type]
    except (ValueError, KeyError, FileNotFoundError) as exc:  # unknown class, bad size
        raise _fail(str(exc)) from None
    graphs = {k for k in range(len(layered)) if train_graph_refusal(layered, k) is None}
    refused: list[str] = []
    while True:
        try:
            plan = plan_split(layered, budget_bytes, batch_size=batch, runtime=figures, backends=(backend,),
                              graph_splits=graphs, rows=rows, local_samples=samples)
        except ValueError as exc:  # PlanError
            raise _fail("; ".join([str(exc), *refused])) from None
        reason = graph_cache.refusal(layered, plan.split) if graph_cache is not None else None
        if reason is None:
            break
        refused.append(f"split {plan.split}: its training graph was refused ({reason})")
        graphs.discard(plan.split)
    typer.echo(f"split {plan.split}/{len(layered)}, role {plan.role}: the largest split whose training fits "
               f"{plan.budget_bytes / 2**20:.0f} MiB on {backend} (footprint {plan.footprint_bytes / 2**20:.0f} MiB)"
               + "".join(f"; {r}, so the next split" for r in refused), err=True)
    return plan.split, [tuple(c) for c in plan.chunks], plan.role


def _print_manifest(out: Path, manifest: Manifest) -> None:
    """What the bundle holds: its chunks, tail (and rows), and training graph."""
    typer.echo(
        f"{out}: {manifest.model} v{manifest.model_version}, split {manifest.split}/{manifest.num_blocks}"
        + (f", role {manifest.role}" if manifest.role else "")
        + f"; for a server sending chunks as {manifest.held_form('chunk')}"
    )
    for c in manifest.chunks:
        typer.echo(f"  chunk [{c.start}, {c.stop}) {c.size:>10,} bytes  {c.id[:12]}")
    typer.echo(f"  tail  [{manifest.tail.start}, {manifest.tail.stop}) {manifest.tail.size:>10,} bytes")
    for r in manifest.tail.rows:
        typer.echo(f"    {r.name}: {r.count:,} of {r.num_rows:,} rows")
    if manifest.train_graph is not None:
        typer.echo(f"  training graph    {manifest.train_graph.size:>10,} bytes  {manifest.train_graph.id[:18]}")


def _read_rows(path: Path) -> dict[str, list[int]]:
    """``{"table entry": [row, ...]}`` from a JSON file, checked: non-empty lists of non-negative integers."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _fail(f"--rows {path}: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise _fail(f"--rows {path}: expected a JSON object mapping table entries to lists of rows")
    out: dict[str, list[int]] = {}
    for name, rows in data.items():
        if not isinstance(rows, list) or not rows or not all(isinstance(r, int) and r >= 0 for r in rows):
            raise _fail(f"--rows {path}: {name!r} must be a non-empty list of non-negative integers")
        out[str(name)] = rows
    return out
