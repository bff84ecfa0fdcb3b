"""``edgetrain profile``: what a model costs block by block, and the split each device gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import typer

from edgetrain.cli import app

if TYPE_CHECKING:
    from rich.console import Console

    from edge_sdk.models import LayeredModel
    from profiles.accounting import Footprint, ModelCost, TrainingMemory
    from profiles.devices import DeviceClass
    from profiles.planner import Plan, PlanError
    from profiles.runtime import Runtime, RuntimeMemory


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@app.command()
def profile(
    model: str = typer.Option("resnet20", help="Model: a zoo name, or package.module:factory for one of your own (docs/models.md)."),
    device: Optional[str] = typer.Option(None, help="Plan for this device class (or a device class .toml file)."),
    budget: Optional[str] = typer.Option(None, help="Plan for this memory budget, e.g. 512MiB, 1.5GiB, 300MB."),
    batch: int = typer.Option(32, help="Training batch size."),
    samples: int = typer.Option(0, help="Samples in the device's local dataset (held in memory, cached activations too)."),
    optimizer_copies: int = typer.Option(1, help="Optimizer state per parameter: 0 SGD, 1 SGD+momentum, 2 Adam."),
    backend: str = typer.Option(
        "auto", help="Plan for a device training on this: a Python device's backend (torch; onnxruntime: training "
                     "graphs, no torch; auto: torch where it is installed, as the device picks) or a JavaScript "
                     "device's runtime (onnxruntime-node; onnxruntime-web: a browser tab; onnxruntime-webgpu: a tab "
                     "on its GPU)."),
    secure_aggregation: bool = typer.Option(False, "--secure-aggregation",
                                            help="Plan as a secure run does: the masked upload and the secure "
                                                 "round's libraries counted (up to 16 MiB more)."),
    list_devices: bool = typer.Option(False, "--list-devices", help="List the device classes and exit."),
    refresh_runtime: bool = typer.Option(False, "--refresh-runtime", help="Measure the runtimes' memory again."),
    measure: bool = typer.Option(False, "--measure", help="Measure this machine's runtimes (on the board itself; "
                                                          "needs no torch) and print them as a device class's "
                                                          "[runtime] table."),
) -> None:
    """Per-block memory of a model, and the role, split and footprint a device gets.

    Without --device or --budget, plans for every device class. Example: edgetrain profile --model
    leaf_cnn --device pi-zero-2w; on a board: edgetrain profile --measure.
    """
    from edgetrain.cli import console as wide_console

    console = wide_console()
    if measure:
        _print_measured(console)
        return
    if list_devices:
        _print_devices(console)
        return
    if device is not None and budget is not None:
        raise _fail("give --device or --budget, not both")
    if batch < 1:
        raise _fail(f"--batch must be at least 1, got {batch}")
    if samples < 0:
        raise _fail(f"--samples must be >= 0, got {samples}")

    from profiles.accounting import TrainingMemory
    from profiles.devices import load_device_class
    from profiles.runtime import runtime_memory
    from profiles.units import parse_size

    try:
        chosen = _runtime(backend)
        memory = TrainingMemory(optimizer_copies=optimizer_copies)
        memory = memory.secured() if secure_aggregation else memory
        budget_bytes = parse_size(budget) if budget is not None else None
        target = load_device_class(device) if device is not None else None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if budget_bytes is not None and budget_bytes <= 0:
        raise _fail(f"--budget must be positive, got {budget!r}")

    from edge_sdk.models.zoo import build_model
    from profiles.accounting import measure_model

    try:
        layered = build_model(model)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    cost = measure_model(layered)
    runtime = runtime_memory(refresh=refresh_runtime)
    on = Target.of(chosen, layered)

    _print_blocks(console, cost, batch, memory, runtime, samples, on)
    if target is not None:
        _print_plan(console, cost, batch, memory, runtime.with_overrides(target.runtime_overrides), target.budget_bytes,
                    target, samples, on)
    elif budget_bytes is not None:
        _print_plan(console, cost, batch, memory, runtime, budget_bytes, None, samples, on)
    else:
        _print_fleet(console, cost, batch, memory, runtime, samples, on)


@dataclass(frozen=True)
class Target:
    """What the plans are for: the runtime a device trains on (``--backend``), and the splits whose
    training graph exports (a graph runtime trains only those)."""

    runtime: Runtime
    graph_splits: frozenset[int]

    @classmethod
    def of(cls, runtime: Runtime, model: LayeredModel) -> Target:
        """``runtime``, and the splits of ``model`` whose training graph the server exports (its static check)."""
        from exporters.train_export import train_graph_refusal

        return cls(runtime, frozenset(k for k in range(len(model)) if train_graph_refusal(model, k) is None))

    @property
    def name(self) -> str:
        return self.runtime.name


def _runtime(name: str) -> Runtime:
    """The runtime ``--backend`` names: one of profiles.runtime.RUNTIMES, or the one the server plans a
    Python device of that backend on (edge_sdk.backends.BACKENDS, auto, package.module:Class)."""
    from profiles.runtime import RUNTIMES, backend_runtime

    if name in RUNTIMES:
        return RUNTIMES[name]
    try:
        return backend_runtime(name)
    except ValueError as exc:
        raise ValueError(f"--backend: {exc}; or a runtime: {', '.join(RUNTIMES)}") from None


def _print_measured(console: Console) -> None:
    """The runtimes' memory measured here, in fresh processes, as TOML for a device class file:
    only the figures of runtimes installed here (a board without torch gives the ONNX Runtime ones)."""
    import importlib.util

    from profiles.runtime import RUNTIME_FIELDS, measure_runtime
    from profiles.units import format_size

    figures = measure_runtime()
    has_torch = importlib.util.find_spec("torch") is not None
    console.print(f"# runtime memory measured on this machine ({figures.source}); paste into its device class file")
    console.print("[runtime]", markup=False)
    for name in RUNTIME_FIELDS:
        if has_torch or "torch" not in name:
            console.print(f'{name} = "{format_size(getattr(figures, name))}"', markup=False)


def _print_devices(console: Console) -> None:
    from rich import box
    from rich.table import Table

    from profiles.devices import device_classes
    from profiles.units import format_size

    table = Table(
        title="Device classes (profiles/devices): budget = RAM x app share; speed relative to a Raspberry Pi 4",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for col in ("class", "RAM", "share", "budget", "cores", "speed", "GPU", "runtime"):
        table.add_column(col, justify="left" if col in ("class", "GPU", "runtime") else "right", no_wrap=True)
    for d in device_classes():
        overrides = d.runtime_overrides.get("torch_onnxruntime")
        table.add_row(
            d.name, format_size(d.ram_bytes), f"{d.app_share:g}", format_size(d.budget_bytes), str(d.cores),
            f"{d.speed:g}", "yes" if d.gpu else "-", format_size(overrides) if overrides else "measured",
        )
    console.print(table)


def _runtime_words(on: Target, runtime: RuntimeMemory) -> str:
    """What the runtime figure of ``on`` is, in words."""
    if on.name == "torch":
        return f"torch + ONNX Runtime after a warm-up step ({runtime.source})"
    if on.name == "onnxruntime":
        return f"ONNX Runtime alone after a first training session, no torch ({runtime.source})"
    return "the JavaScript device's, measured where it runs (profiles/runtime.py)"


def _footprint(cost: ModelCost, k: int, batch: int, memory: TrainingMemory, runtime: RuntimeMemory, samples: int,
               on: Target) -> Footprint | None:
    """Split ``k``'s footprint on ``on``'s runtime, counted as the server counts it; None where that
    runtime cannot train the split (a graph runtime, a training graph that does not export)."""
    from profiles.planner import tail_footprint

    if not on.runtime.can_train(k, on.graph_splits):
        return None
    return tail_footprint(cost, k, batch, backend=on.name, runtime=runtime, memory=memory, local_samples=samples)


def _print_blocks(console: Console, cost: ModelCost, batch: int, memory: TrainingMemory, runtime: RuntimeMemory,
                  samples: int, on: Target) -> None:
    from rich import box
    from rich.table import Table

    from profiles.runtime import RUNTIMES
    from profiles.units import format_size

    shown = [on] + [Target(RUNTIMES[n], on.graph_splits) for n in ("torch", "onnxruntime") if n != on.name]
    whole_p, whole_a = cost.trainable_params(0), cost.activations(0, batch)
    table = Table(
        title=(
            f"{cost.model}: {len(cost)} blocks, {whole_p:,} trainable parameters, {whole_a:,} activations "
            f"at batch {batch}; split k trains blocks [k, {len(cost)})"
        ),
        title_justify="left",
        caption=(
            f"act/sample: outputs of conv/linear/recurrent layers per sample (EmbracingFL Table 1), and "
            f"attention matrices (attn/sample: heads x context^2 per attention layer); "
            f"suffix params: trainable parameters of blocks [k, {len(cost)}); "
            f"capacity = (2p + 2a) / (2P + 2A) at batch {batch}; footprint on R: peak bytes of split k at "
            f"batch {batch}, {memory.dtype}, on runtime R, the process's own {format_size(memory.process_bytes)} "
            f"and {samples} local samples (--samples) included; "
            + "; ".join(f"{t.name}: {format_size(runtime.for_backend(t.name))} runtime, "
                        f"{_runtime_words(t, runtime)}" for t in shown)
            + "; -: a split whose training graph does not export"
        ),
        caption_justify="left",
    )
    table.box = box.SIMPLE_HEAD
    table.add_column("k", justify="right", no_wrap=True, min_width=2)
    table.add_column("block", no_wrap=True)
    for col in ("params", "act/sample", "attn/sample", "suffix params", "capacity",
                *(f"footprint on {t.name}" for t in shown)):
        table.add_column(col, justify="right", no_wrap=True)
    for b in cost.blocks:
        k = b.index
        footprints = [_footprint(cost, k, batch, memory, runtime, samples, t) for t in shown]
        table.add_row(
            str(k), b.name + (" (sparse)" if b.sparse else ""), f"{b.params:,}", f"{b.activations:,}",
            f"{b.attention_elements:,}", f"{cost.trainable_params(k):,}", f"{cost.capacity(k, batch):.3f}",
            *(format_size(f.total) if f is not None else "-" for f in footprints),
        )
    console.print(table)


def _plan(cost: ModelCost, budget_bytes: int, batch: int, memory: TrainingMemory, runtime: RuntimeMemory,
          samples: int, on: Target) -> Plan | PlanError:
    from profiles.planner import PlanError, plan_split

    try:
        return plan_split(cost, budget_bytes, batch, runtime=runtime, memory=memory, local_samples=samples,
                          backends=(on.name,), graph_splits=on.graph_splits)
    except PlanError as exc:
        return exc


def _elsewhere(cost: ModelCost, budget_bytes: int, batch: int, memory: TrainingMemory, runtime: RuntimeMemory,
               samples: int, on: Target) -> str:
    """Where a budget refused on ``on``'s runtime does fit: each other runtime's plan, in a line."""
    from profiles.planner import Plan
    from profiles.runtime import RUNTIMES

    fits = [(name, plan) for name in RUNTIMES if name != on.name
            for plan in [_plan(cost, budget_bytes, batch, memory, runtime, samples, Target(RUNTIMES[name], on.graph_splits))]
            if isinstance(plan, Plan)]
    return "; ".join(f"on {name}: {plan.role}, split {plan.split} (--backend {name})" for name, plan in fits)


def _print_plan(
    console: Console,
    cost: ModelCost,
    batch: int,
    memory: TrainingMemory,
    runtime: RuntimeMemory,
    budget_bytes: int,
    device: DeviceClass | None,
    samples: int,
    on: Target,
) -> None:
    from rich.table import Table

    from profiles.planner import PlanError, backend_memory
    from profiles.units import format_size

    who = device.summary() if device is not None else f"budget {format_size(budget_bytes)}"
    plan = _plan(cost, budget_bytes, batch, memory, runtime, samples, on)
    if isinstance(plan, PlanError):
        fits = _elsewhere(cost, budget_bytes, batch, memory, runtime, samples, on)
        console.print(f"[bold]Plan for {who} on {on.name}[/bold]\n[red]refused:[/red] {plan}"
                      + (f"\nfits {fits}" if fits else ""))
        raise typer.Exit(code=1)
    chunks = ", ".join(f"[{s}, {e})" for s, e in plan.chunks) or "none (trains the whole model)"
    fp, copies = plan.footprint, backend_memory(memory, on.name)
    table = Table(title=f"Plan for {who} on {on.name}", title_justify="left", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    table.add_column(justify="left")
    table.add_row("role", plan.role, f"capacity {plan.capacity:.3f}")
    trained = ", ".join(cost.block_names[plan.split:]) + (" through their adapters (LoRA)" if plan.adapters else "")
    table.add_row("split", f"{plan.split} / {plan.num_blocks}", f"trains {trained}")
    table.add_row("frozen chunks", str(len(plan.chunks)), chunks)
    table.add_row("trainable state", format_size(fp.trainable_state),
                  f"{plan.trainable_params:,} params x {copies.param_copies + copies.transfer_copies} "
                  "(weight, gradient, momentum, received tail"
                  + (", the runtime's own copies" if copies.param_copies > memory.param_copies else "") + ") + buffers")
    table.add_row("activations", format_size(fp.activations), "saved for backward + backward's working set")
    table.add_row("cached input", format_size(fp.cached_input),
                  f"the tail's input for {samples} local samples" if samples and plan.split else "one batch")
    table.add_row("local data", format_size(fp.local_data), f"{samples} samples (--samples)")
    table.add_row("largest frozen chunk", format_size(fp.frozen_chunk), "ONNX Runtime session + weights + one batch")
    table.add_row("runtime", format_size(fp.runtime), _runtime_words(on, runtime))
    table.add_row("process", format_size(fp.process), "connection buffers, worker thread, allocator slack"
                  + (", the secure round's libraries" if memory.secure_bytes else ""))
    table.add_row("upload", format_size(fp.upload), "the tail's values and their encoded frame"
                  + (" and masked words" if memory.secure_bytes else ""))
    peak = (
        f"max(streaming {format_size(fp.streaming)}, training {format_size(fp.training)}, upload)"
        if fp.sequential
        else "sum of the parts, or the upload"
    )
    table.add_row("footprint", format_size(plan.footprint_bytes),
                  f"({peak} + local data) x {1 + fp.margin:.2f} margin + runtime + process")
    table.add_row("budget", format_size(plan.budget_bytes), f"{plan.footprint_bytes / plan.budget_bytes:.0%} used")
    console.print(table)


def _print_fleet(console: Console, cost: ModelCost, batch: int, memory: TrainingMemory, runtime: RuntimeMemory,
                 samples: int, on: Target) -> None:
    from rich import box
    from rich.table import Table

    from profiles.devices import device_classes
    from profiles.planner import PlanError
    from profiles.runtime import RUNTIMES
    from profiles.units import format_size

    # Beside the chosen runtime's plans, the same device trained from ONNX training graphs (no torch), or
    # on torch when the chosen runtime is ONNX Runtime's.
    other = Target(RUNTIMES["torch" if on.name == "onnxruntime" else "onnxruntime"], on.graph_splits)
    table = Table(title=f"Plans for every device class ({cost.model}, batch {batch}) on {on.name}, and on {other.name}",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("class", "budget", "role", "split", "chunks", "capacity", "footprint", f"{other.name}\nrole",
                f"{other.name}\nsplit", f"{other.name}\nfootprint"):
        table.add_column(col, justify="left" if col in ("class", "role", "chunks", f"{other.name}\nrole") else "right",
                         no_wrap=col != "chunks",  # a class's name is never cut short: the other columns give way
                         min_width=max(len(d.name) for d in device_classes()) if col == "class" else None)
    for d in device_classes():
        figures = runtime.with_overrides(d.runtime_overrides)
        plan = _plan(cost, d.budget_bytes, batch, memory, figures, samples, on)
        alt = _plan(cost, d.budget_bytes, batch, memory, figures, samples, other)
        alt_cells = ((alt.role, str(alt.split), format_size(alt.footprint_bytes)) if not isinstance(alt, PlanError)
                     else ("[red]refused[/red]", "-", f"needs {format_size(alt.needed_bytes)}"))
        if isinstance(plan, PlanError):
            table.add_row(d.name, format_size(d.budget_bytes), "[red]refused[/red]", "-", "-", "-",
                          f"needs {format_size(plan.needed_bytes)}", *alt_cells)
            continue
        chunks = " ".join(f"[{s},{e})" for s, e in plan.chunks) or "-"
        table.add_row(
            d.name, format_size(d.budget_bytes), plan.role, str(plan.split), chunks, f"{plan.capacity:.2f}",
            format_size(plan.footprint_bytes), *alt_cells,
        )
    console.print(table)
