"""Memory the runtimes themselves take: the RSS of a fresh Python process after its imports.

A device budget is the device's whole memory for the app, so the runtime counts before the
model does: on a 512 MiB board torch alone takes over 40% of what an app may use (docs/measurements.md,
"Memory of the runtimes"). Importing is not all: what a first ONNX Runtime session and a first
training step leave behind is about 30 MiB more on torch 2.13 (``torch.optim`` would add 70 MiB
of sympy and ``torch._dynamo``, which is why edge_sdk.trainer has its own SGD), so a training
device is charged ``torch_training``, measured after doing both the way a device does them.

The figures are measured on the machine that plans, in fresh subprocesses (about 3 s), and
cached per Python / torch / ONNX Runtime version; a device class may override them with
figures measured on the device itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import MappingProxyType

from edge_sdk.backends import BACKENDS, KINDS, TrainingBackend, backend_class
from edge_sdk.fileio import atomic_write

__all__ = [
    "FALLBACK",
    "RUNTIMES",
    "RUNTIME_FIELDS",
    "Runtime",
    "RuntimeMemory",
    "UnknownRuntime",
    "backend_runtime",
    "device_runtime",
    "default_cache_file",
    "measure_runtime",
    "runtime_key",
    "runtime_memory",
]

_MiB = 1024 * 1024

# What a training device has done before its peak: loaded its own modules (websockets, msgpack,
# the client), run an ONNX Runtime session (edge_sdk.forward.warm_up; what ONNX Runtime keeps after
# its first session stays) and taken one training step exactly as it takes them
# (edge_sdk.trainer.warm_up, whose own momentum SGD keeps torch.optim's sympy and torch._dynamo,
# ~70 MiB, out of the process; the step initialises torch's CPU kernels).
_WARM_UP = (
    "import edge_sdk.client\n"
    "from edge_sdk.forward import warm_up as ort_warm_up\nort_warm_up()\n"
    "from edge_sdk.trainer import warm_up\nwarm_up()\n"
)

# A device that trains from ONNX training graphs (edge_sdk.ort_trainer): the same modules and
# ONNX Runtime session, and never torch.
_ORT_WARM_UP = (
    "import edge_sdk.client, edge_sdk.ort_trainer\n"
    "from edge_sdk.ort_trainer import warm_up\nwarm_up()\n"
)

#: Bumped whenever what the figures run changes, so cached figures of an older recipe are re-measured.
_RECIPE = 5

#: What each figure runs in a fresh interpreter before its RSS is read.
_IMPORTS: dict[str, str] = {
    "python": "",
    "onnxruntime": "import onnxruntime",
    "torch": "import torch",
    "torch_onnxruntime": "import torch, onnxruntime",
    "torch_training": "import torch, onnxruntime\n" + _WARM_UP,
    "onnxruntime_training": "import onnxruntime\n" + _ORT_WARM_UP,
}

#: Names of the figures, as accepted in overrides (device classes' ``[runtime]`` tables).
RUNTIME_FIELDS: tuple[str, ...] = tuple(_IMPORTS)


class UnknownRuntime(ValueError):
    """A device names no runtime of :data:`RUNTIMES`: nothing it has can be planned."""


@dataclass(frozen=True)
class Runtime:
    """One training runtime a device may name in ``Hello.runtimes``.

    ``memory``: what a training device with it holds before its model, either the name of a
    :class:`RuntimeMemory` figure (measured on the planning machine, overridable per device class)
    or a fixed byte count measured elsewhere (a runtime this machine cannot start, e.g. a browser's).
    ``backend``: how the device trains, one of the training backends' kinds
    (:data:`edge_sdk.backends.KINDS`): ``torch`` (the tail as a torch module: any split) or
    ``graph`` (an exported ONNX training graph: only splits whose graph exports and verifies).
    ``training_copies``: copies of the trainable parameters the runtime holds while it trains beyond
    what :class:`profiles.accounting.TrainingMemory` counts for every device (measured where it runs;
    see :data:`WEB_TRAINING_COPIES`).
    ``attention_compile_bytes``: what the runtime holds beyond ``memory`` while it compiles the kernels of
    a model with attention layers the first time they run hot (:data:`WEB_ATTENTION_COMPILE_BYTES`).
    """

    name: str
    memory: str | int
    backend: str
    training_copies: int = 0
    attention_compile_bytes: int = 0

    def __post_init__(self) -> None:
        if self.backend not in KINDS:
            raise ValueError(f"runtime {self.name}: backend must be {' or '.join(KINDS)}, not {self.backend!r}")
        if self.training_copies < 0:
            raise ValueError(f"runtime {self.name}: training_copies must be >= 0, not {self.training_copies}")
        if self.attention_compile_bytes < 0:
            raise ValueError(f"runtime {self.name}: attention_compile_bytes must be >= 0, not {self.attention_compile_bytes}")

    def compile_bytes(self, attention: bool) -> int:
        """What this runtime holds beyond its figure to compile a model's kernels: ``attention``, the
        model the device runs (its frozen chunks and its tail) has attention layers."""
        return self.attention_compile_bytes if attention else 0

    @property
    def needs_graph(self) -> bool:
        """Whether a device on this runtime trains from a training graph the server exports."""
        return self.backend == "graph"

    def can_train(self, split: int, graph_splits: frozenset[int] | set[int]) -> bool:
        """Whether this runtime trains the tail from ``split`` (graph runtimes: only at ``graph_splits``)."""
        return not self.needs_graph or split in graph_splits


#: What the WebGPU build's tab holds before its model: its renderer after the probe (256.1 MiB) and what
#: the GPU process grew by for it (22.4 MiB; ``node edge_sdk_js/bench/run.mjs runtime webgpu``,
#: 2026-11-28), and beyond that what its renderer holds while it trains on the GPU: a weak digits_mlp tab
#: (split 3, 82 KB of trainable parameters, so nothing a parameter copy could count) grows by 100-150 MiB
#: of anonymous memory during its GPU steps, outside the JavaScript heap (9-80 MiB) and the WebAssembly
#: memory (75.6 MiB); a full collection after every run does not remove it, and it lasts into the next
#: round's downloads. Its renderer peaked at 448-484 MiB in nine runs of 4-5 rounds of 10 steps, where the
#: figure of 287 MiB then planned it at 383.5 MiB, and at 503 MiB in one more (SwiftShader on the shared
#: 2-core machine, loaded, 2026-12-06: ``node edge_sdk_js/bench/budgets.mjs gputab digits_mlp 400 5
#: --trace``; BENCHMARKS.md); 430 MiB puts the weak plan (527 MiB) 24 MiB above the highest peak. It
#: stays above onnxruntime-web, whose fallback it covers. The GPU process (SwiftShader's buffers and
#: shaders: 290-299 MiB at its peak in the same runs, 383-407 MiB beside a moderate tab) is reported beside
#: the renderer, not planned: on a phone it is the GPU driver's memory, which a page can neither see nor
#: bound.
WEBGPU_RUNTIME_BYTES = 430 * _MiB

#: Resident memory of the JavaScript runtimes with the SDK loaded and a first session run, in bytes
#: (Node 20, onnxruntime-node/-web 1.30). Re-measured on the shared 2-core machine, 2026-11-28, with the
#: SDK's session options (no CPU arena, no prepacked weights): ``node edge_sdk_js/bench/run.mjs runtime node``
#: (87-88 MiB) and ``... runtime browser`` (a renderer's peak, 224 MiB); ``bench/js_budgets.py`` runs devices
#: on plans made with these and reports their peaks. onnxruntime-node stays at 82 MiB: with the planner's
#: process allowance (24 MiB) it covers what a running device holds between phases (111-115 MiB), and Node
#: devices keep their plans with it (a weak digits_mlp device peaked at 168-174 MiB on a plan of 179 MiB, a
#: strong one at 358 MiB at 400). onnxruntime-web adds 46 MiB to the renderer's 224: a WebAssembly heap never
#: shrinks, so the largest session a tab has created (a frozen chunk's: its bytes copied into the heap,
#: parsed, its initializers) stays resident, which the planner's frozen-chunk copies, sized for a native
#: runtime that frees them, leave out (a weak digits_mlp tab, two 17 MB chunks, peaked 365 MiB on a plan
#: of 320 MiB); what a tab holds while it trains is :data:`WEB_TRAINING_COPIES`. onnxruntime-web carries
#: 16 MiB more than the renderer's measured figure: a weak digits_mlp tab peaked at 379.9 MiB between
#: rounds (its update going out while the next round's chunks come in) on a plan of 367 MiB without it
#: (``bench/js_budgets.py --trace``, 2026-11-28), so the weak plan is 383 MiB and a 375 MiB tab is refused
#: rather than overrun. onnxruntime-webgpu: :data:`WEBGPU_RUNTIME_BYTES`.
JS_RUNTIME_MEMORY: Mapping[str, int] = MappingProxyType({
    "onnxruntime-node": 82 * _MiB,
    "onnxruntime-web": 286 * _MiB,
    "onnxruntime-webgpu": WEBGPU_RUNTIME_BYTES,
})

#: Copies of the trainable parameters a Chromium tab (onnxruntime-web, WebAssembly) holds while it
#: trains beyond every graph device's (weight, gradient, momentum, the received state): the
#: WebAssembly heap keeps the weights fed into a step and the gradients it produced at its high-water
#: mark (2; it never shrinks), and each step's gradients, copied out of the heap into new JavaScript
#: arrays, stay until V8 collects them, which a page cannot ask for (7: the tab's JavaScript heap held
#: up to 110 MiB of them, about 7 steps' gradients of a 4.2M-parameter tail, at its peak). Measured on
#: the shared 2-core machine, 2026-11-28: a moderate digits_mlp tab (split 2, 16 MiB of trainable
#: parameters) peaked at 478-524 MiB on a plan of 387 MiB without them (``bench/js_budgets.py --trace``).
#: The WebGPU build's tab holds them too (its trainer copies each step's gradients out of the GPU into new
#: arrays the same way): a moderate digits_mlp tab on the GPU (split 2) had up to 155 MiB of JavaScript
#: heap, 110 MiB more than a weak one, and peaked at 512-529 MiB on a plan of 403 MiB without them
#: (SwiftShader, 2026-12-06).
WEB_TRAINING_COPIES = 9

#: What a Chromium tab's renderer (onnxruntime-web, WebAssembly) holds beyond its runtime figure while V8's
#: optimising tier (TurboFan) compiles the ONNX Runtime kernels a transformer's graphs run hot. V8 first runs
#: WebAssembly through its baseline compiler (Liftoff) and recompiles a function once it has run often
#: enough, in the background, in compilation memory of its own: not the JavaScript heap, not the WebAssembly
#: memory, not an array a collection frees. A transformer's training graph runs ~35 kinds of operator
#: (batched MatMul, Transpose, Softmax, LayerNormalization, Erf, their gradients), so over its first 5-15
#: steps the renderer grows by 100-120 MiB of anonymous memory, and falls back once they are compiled; a
#: digits_mlp tab's few kernels (Gemm, Relu) are inside the runtime figure, which its peaks measured. It
#: depends on the kernels run, not on the model's shapes: the test-sized char_transformer_tiny@rank=4 (35K
#: parameters, 23 MiB of WebAssembly memory) trained through its adapters peaked at 344-364 MiB with the
#: optimising tier and at 240-253 MiB without it (``--liftoff-only``, a switch a page cannot set):
#: ``node edge_sdk_js/bench/tab-steps.mjs char_transformer_tiny@rank=4 0 4 --adapters [--liftoff-only]``,
#: shared 2-core machine, 2026-12-06, load 9-12 (BENCHMARKS.md). Charged whole, as its highest measured
#: difference (364.1 - 244.3 MiB), for every model with attention layers: what part of it the runtime
#: figure already holds for an MLP's kernels is not separated.
WEB_ATTENTION_COMPILE_BYTES = 120 * _MiB

#: The training runtimes, in the order the planner prefers them (a device that names several is
#: planned on the first of them here): torch steps are faster; ONNX Runtime needs far less memory.
#: Adding a runtime is one entry.
RUNTIMES: Mapping[str, Runtime] = MappingProxyType({r.name: r for r in (
    Runtime("torch", memory="training", backend="torch"),
    Runtime("onnxruntime", memory="onnxruntime_training", backend="graph"),
    # The JavaScript SDK (edge_sdk_js), measured where it runs, not on the planning machine
    # (docs/measurements.md, "Memory of the runtimes"): a Node process with the SDK, onnxruntime-node
    # and a first session; a headless Chromium tab's renderer with the SDK, onnxruntime-web and a first
    # session (the page's renderer before ONNX Runtime starts is 130-145 MiB of it; onnxruntime-web under
    # Node takes 122-136 MiB). Not in it: while a tab trains its first steps, V8 compiles ONNX Runtime's
    # hot kernels to optimised code, which holds about 120 MiB more for a few seconds (ResNet20's tail).
    Runtime("onnxruntime-node", memory=JS_RUNTIME_MEMORY["onnxruntime-node"], backend="graph"),
    # A tab training on its GPU (onnxruntime-web's WebGPU build) names this and onnxruntime-web, and is
    # planned on this: its renderer with the WebGPU build, what it holds while it trains on the GPU and the
    # same gradient copies as the WebAssembly build (WEBGPU_RUNTIME_BYTES; on SwiftShader, docs/js-device.md
    # "WebGPU" says what a page cannot see). Before the web entry: it costs more, and covers the tab
    # falling back to WebAssembly.
    Runtime("onnxruntime-webgpu", memory=WEBGPU_RUNTIME_BYTES, backend="graph", training_copies=WEB_TRAINING_COPIES),
    Runtime("onnxruntime-web", memory=JS_RUNTIME_MEMORY["onnxruntime-web"], backend="graph",
            training_copies=WEB_TRAINING_COPIES, attention_compile_bytes=WEB_ATTENTION_COMPILE_BYTES),
)})

def device_runtime(names: Sequence[str]) -> Runtime:
    """The runtime a device that names ``names`` (its hello's runtimes) trains with: the first of
    :data:`RUNTIMES` it names. Raises :class:`UnknownRuntime` naming the known ones."""
    for runtime in RUNTIMES.values():
        if runtime.name in names:
            return runtime
    raise UnknownRuntime(f"no known training runtime among {list(names)[:8]}; known: {', '.join(RUNTIMES)}")


def backend_runtime(backend: str | type[TrainingBackend]) -> Runtime:
    """The runtime the server plans a device training with ``backend`` on (a name of the Python
    device's table :data:`edge_sdk.backends.BACKENDS`, ``auto``, ``package.module:Class``): the first
    of :data:`RUNTIMES` its hello names. ValueError when it names none, or when that runtime trains
    otherwise than the backend does (its kind): the backends' table and this registry agree."""
    cls = backend_class(backend)
    runtime = device_runtime(cls.runtimes)
    if runtime.backend != cls.kind:
        raise ValueError(f"backend {cls.name} trains from {cls.kind}, but the runtime it is planned on, "
                         f"{runtime.name}, trains from {runtime.backend}")
    return runtime


for _backend in BACKENDS.values():  # a table entry this registry cannot plan fails here, not at a hello
    backend_runtime(_backend)
del _backend


@dataclass(frozen=True)
class RuntimeMemory:
    """RSS in bytes of a fresh Python process after importing each runtime.

    ``onnxruntime_training`` is a device that trains from ONNX training graphs: the device's
    modules and an ONNX Runtime session, no torch.
    ``torch_training`` goes one step further than ``torch_onnxruntime``: the process has also
    taken one tiny training step with ``torch.optim.SGD``, which initialises torch's kernels and
    imports what the optimizer needs; that is what a training device holds before its model.
    ``source`` says where the figures come from: ``measured``, ``cache``, ``fallback``,
    ``override``, or a combination such as ``measured+fallback``.
    """

    python: int
    onnxruntime: int
    torch: int
    torch_onnxruntime: int
    torch_training: int
    onnxruntime_training: int
    source: str = "measured"

    @property
    def training(self) -> int:
        """A device that trains its tail with torch and runs its frozen chunks in ONNX Runtime."""
        return max(self.torch_training, self.torch_onnxruntime)

    def for_backend(self, runtime: str) -> int:
        """What a training device on ``runtime`` (a name in :data:`RUNTIMES`) holds before its model:
        e.g. ``torch`` (tail in torch, chunks in ONNX Runtime) or ``onnxruntime`` (no torch)."""
        entry = RUNTIMES.get(runtime)
        if entry is None:
            raise ValueError(f"unknown training runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
        return entry.memory if isinstance(entry.memory, int) else int(getattr(self, entry.memory))

    @property
    def inference(self) -> int:
        """A device that only runs ONNX chunks (no torch)."""
        return self.onnxruntime

    def with_overrides(self, overrides: Mapping[str, int]) -> RuntimeMemory:
        """These figures with some replaced (e.g. measured on the device itself)."""
        if not overrides:
            return self
        unknown = set(overrides) - set(RUNTIME_FIELDS)
        if unknown:
            raise ValueError(
                f"unknown runtime figure(s) {sorted(unknown)}; known: {', '.join(RUNTIME_FIELDS)}"
            )
        return dataclasses.replace(self, **dict(overrides), source=f"{self.source}+override")

    def to_dict(self) -> dict[str, int | str]:
        return dataclasses.asdict(self)


#: docs/measurements.md ("Memory of the runtimes"), measured with torch 2.13.0+cpu and onnxruntime 1.31.1 on
#: the project's machine; ``torch_training`` adds the 30 MiB that the device's warm-up (an ONNX
#: session, a training step) added there on top of importing torch and onnxruntime. Used only
#: where measuring fails (e.g. no torch installed).
FALLBACK = RuntimeMemory(
    python=round(12.6 * _MiB),
    onnxruntime=round(45.9 * _MiB),
    torch=round(218.8 * _MiB),
    torch_onnxruntime=round(237.0 * _MiB),
    torch_training=round((237.0 + 30.0) * _MiB),
    # docs/measurements.md ("Training without torch"): 44 MiB after import, 56 MiB with the session.
    onnxruntime_training=round(56.0 * _MiB),
    source="fallback",
)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def runtime_key(python: str | os.PathLike[str] | None = None) -> str:
    """The cache key: what the figures depend on (interpreter, torch and ONNX Runtime versions).

    Versions are read from package metadata, so computing the key imports neither runtime.
    """
    if python is not None and Path(python) != Path(sys.executable):
        return f"{Path(python)}|{platform.machine()}"
    return (
        f"py{platform.python_version()}|torch{_version('torch')}|"
        f"ort{_version('onnxruntime')}|{platform.machine()}|recipe{_RECIPE}"
    )


def default_cache_file() -> Path:
    """``$EDGETRAIN_CACHE_DIR/runtime.json``, else ``$XDG_CACHE_HOME/edgetrain``, else ``~/.cache/edgetrain``."""
    root = os.environ.get("EDGETRAIN_CACHE_DIR")
    if root:
        return Path(root) / "runtime.json"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "edgetrain" / "runtime.json"


def measure_runtime(python: str | os.PathLike[str] | None = None, *, timeout: float = 120.0) -> RuntimeMemory:
    """Start one fresh interpreter per figure, let it import, and read its RSS from outside.

    The children run concurrently; each imports, says it is ready, and waits for its stdin to
    close, so the RSS read (with psutil, in this process) is that of the imports alone. A figure
    whose child fails (e.g. the runtime is not installed) falls back to :data:`FALLBACK`.
    """
    import psutil

    interpreter = str(python or sys.executable)
    children: dict[str, subprocess.Popen[str]] = {}
    figures: dict[str, int] = {}
    failed: list[str] = []
    try:
        for name, imports in _IMPORTS.items():
            code = f"{imports}\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()\n"
            try:
                children[name] = subprocess.Popen(
                    [interpreter, "-c", code],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            except OSError:
                failed.append(name)
        deadline = time.monotonic() + timeout
        for name, child in children.items():
            assert child.stdout is not None
            line = _readline(child, deadline)
            if line.strip() != "ready":
                failed.append(name)
                continue
            figures[name] = psutil.Process(child.pid).memory_info().rss
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()
    for name in failed:
        figures[name] = getattr(FALLBACK, name)
    source = "measured" if not failed else ("fallback" if len(failed) == len(_IMPORTS) else "measured+fallback")
    return RuntimeMemory(**figures, source=source)


def _readline(child: subprocess.Popen[str], deadline: float) -> str:
    """A line from the child's stdout, or "" if it exits or the deadline passes first."""
    import selectors

    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sel.select(remaining):
            return ""
    return child.stdout.readline()


def runtime_memory(
    *,
    cache_file: str | os.PathLike[str] | None = None,
    refresh: bool = False,
    python: str | os.PathLike[str] | None = None,
) -> RuntimeMemory:
    """The runtime figures for this machine: from the cache, else measured (about 3 s) and cached.

    Figures that had to fall back are not cached, so the next call measures again.
    """
    path = Path(cache_file) if cache_file is not None else default_cache_file()
    key = runtime_key(python)
    entries = _read_cache(path)
    if not refresh and key in entries:
        try:
            return RuntimeMemory(**{f: int(entries[key][f]) for f in RUNTIME_FIELDS}, source="cache")
        except (KeyError, TypeError, ValueError):
            pass  # a damaged entry: measure again
    measured = measure_runtime(python)
    if measured.source == "measured":
        entries[key] = {f: getattr(measured, f) for f in RUNTIME_FIELDS}
        _write_cache(path, entries)
    return measured


def _read_cache(path: Path) -> dict[str, dict[str, int]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, entries: dict[str, dict[str, int]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(entries, indent=2, sort_keys=True) + "\n"
        atomic_write(path, text.encode(), durable=False)  # a cache: measured again if lost
    except OSError:
        pass  # a read-only home: measure next time instead
