"""A tail's training step as plain ONNX: a device trains without torch (edge_sdk.ort_trainer).

For a layered model and a split k, :func:`export_train_graph` exports two graphs of blocks [k, L),
packed as one payload (edge_sdk.ort_trainer reads it):

- the training step (train mode): inputs ``input`` (a batch, dynamic size), ``target`` (its
  labels), then one input per trainable parameter and per floating buffer; outputs ``loss``, one
  ``grad:<name>`` per trainable parameter, one ``new:<name>`` per floating buffer (BatchNorm's
  running statistics after the step). The optimizer update is left to the device (numpy).
- the evaluation forward (eval mode): ``input`` and the same parameters and buffers in, the
  tail's ``output`` out; the device's loss before and after training.

The recipe (docs/measurements.md, "Training without torch"): ``torch.export`` of a module returning the
loss, ``_export_forward_backward`` for the joint graph, a wrapper that calls the joint graph with
parameters and buffers as ordinary inputs (the joint graph itself exports with no outputs),
export again with a dynamic batch, decompose what has no faithful ONNX lowering
(``convolution_backward`` into convolutions; train-mode BatchNorm, which onnxscript would
otherwise lower silently as inference BatchNorm), then ``torch.onnx.export``.

Every graph is verified before it is used (:func:`verify_train_graph`): loss, gradients and new
buffers against torch autograd in float64 on a sample batch, and the evaluation output against
torch eval; a graph that disagrees raises :class:`ExportError` naming the worst tensor. A ReLU
whose float64 input lies within float32 rounding of zero has no float32-determined derivative:
there the reference takes the graph's side (:class:`ReluSides`). Without that, one such unit in
ResNet20's whole-model step (an input of 7e-7 that ONNX Runtime's float32 rounds to zero, torch's
does not) moved the stem's weight gradient by 1e-3 and refused a correct graph.

Tails refused up front (:func:`train_graph_refusal`), which devices train with torch instead:
embedding tables fetched by rows (FedSubAvg submodels: the graph would return the whole table's
gradient every step, and a row-sparse update needs its own gather/scatter), recurrent layers
(unrolled to a fixed sequence length: over 1,000 nodes and ~1 MB per direction at length 20, far
more at the IMDB model's 256) and dropout (random masks drawn inside the graph cannot be checked
against torch, and would differ from the torch trainer's).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import threading
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch._decomp
import torch.export.experimental
import onnx
import onnxruntime as ort
from torch import nn
from torch.overrides import TorchFunctionMode

from edge_sdk.fileio import atomic_write
from edge_sdk.models.layered import LayeredModel
from edge_sdk.ort_trainer import GRAPH_FORMAT, OrtTail, TrainGraph
from exporters.onnx_export import ExportError

__all__ = [
    "ReluSides",
    "TrainExportSettings",
    "TrainGraphCache",
    "export_train_graph",
    "state_name",
    "tail_names",
    "task_loss",
    "torch_step",
    "train_graph_id",
    "train_graph_refusal",
    "verify_train_graph",
]

_ID_FORMAT = 4  # bump when the key encoding below, the graph recipe or the export check changes (2: onnxscript's
#                 optimizer; 3: the model's architecture in the key; 4: ReLU sides in the check, refusals redone)


@dataclass(frozen=True)
class TrainExportSettings:
    """How training graphs are exported and checked; part of a graph's content address.

    ``tolerance`` bounds the max absolute difference, relative to the tensor's largest magnitude
    (at least 1), between ONNX Runtime and torch autograd for the loss, every gradient and every
    new buffer, on a sample batch of ``verify_batch`` samples and on one of ``verify_batch + 1``
    (which catches a batch axis fixed by the exporter).
    """

    opset: int = 18
    tolerance: float = 1e-4
    verify_batch: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.opset, int) or not 18 <= self.opset <= 23:
            raise ValueError(f"opset must be an integer in [18, 23], got {self.opset!r}")
        if not (isinstance(self.tolerance, (int, float)) and math.isfinite(self.tolerance) and self.tolerance > 0):
            raise ValueError(f"tolerance must be a positive number, got {self.tolerance!r}")
        if not isinstance(self.verify_batch, int) or self.verify_batch < 2:
            raise ValueError(f"verify_batch must be an integer >= 2, got {self.verify_batch!r}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def train_graph_refusal(model: LayeredModel, split: int) -> str | None:
    """Why blocks [split, L) cannot be trained from an ONNX graph (None: they can).

    A static check on the modules, so the planner can ask it for every split at no cost.
    """
    if not 0 <= split < len(model):
        raise ValueError(f"split {split} outside [0, {len(model)})")
    if type(model).loss is not LayeredModel.loss:
        return (f"a loss of the model's own ({type(model).__name__}.loss, task {model.task}): the export check "
                "covers the built-in losses only")
    names = model.block_names[split:]
    sparse = sorted(set(names) & model.sparse_blocks)
    if sparse:
        return f"row-sparse embedding tables ({', '.join(sparse)}): submodels train their rows with torch"
    for name in names:
        for module in model.blocks[name].modules():
            if isinstance(module, nn.RNNBase):
                return f"recurrent layer in {name}: the unrolled graph is too large"
            if isinstance(module, nn.Dropout) and module.p > 0:
                return f"dropout in {name}: random masks cannot be verified against torch"
            if isinstance(module, nn.Embedding) and module.sparse:
                return f"sparse embedding in {name}: no ONNX lowering for sparse gradients"
    return None


def architecture_id(model: LayeredModel) -> str:
    """sha256 (hex, 16 digits) of a model's architecture: its modules as torch prints them and its
    state's names, shapes and dtypes. A user's factory (``package.module:factory``) may change under
    the same name; its graphs must not be taken for the old ones. Computed once per model object."""
    cached = model.__dict__.get("_architecture_id")
    if cached is None:
        h = hashlib.sha256(repr(model).encode())
        for name, value in model.state_dict().items():
            h.update(f"{name}:{tuple(value.shape)}:{value.dtype};".encode())
        cached = h.hexdigest()[:16]
        model.__dict__["_architecture_id"] = cached
    return cached


def train_graph_id(model_name: str, split: int, task: str, settings: TrainExportSettings, width: float = 1.0,
                   architecture: str = "") -> str:
    """sha256 (hex) of what determines a training graph's bytes. The weights are inputs of the
    graph, not part of it, so one graph serves every round. ``width``: the ratio the model was
    built at (width reduction); a narrow model's graph has other shapes than the full one's.
    ``architecture``: :func:`architecture_id` of the model."""
    key = {"format": _ID_FORMAT, "graph": GRAPH_FORMAT, "model": model_name, "split": split, "loss": task,
           "settings": settings.as_dict(), "torch": torch.__version__, "architecture": architecture}
    if float(width) != 1.0:  # the full model's ids stay what they were
        key["width"] = float(width)
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "train-" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


# -- decompositions ---------------------------------------------------------------------------
def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    """aten.convolution_backward as forward convolutions (it has no ONNX lowering)."""
    if transposed or groups != 1:
        raise NotImplementedError("only plain convolutions (groups 1, not transposed) are decomposed")
    aten = torch.ops.aten
    nd = weight.dim() - 2
    kernel = list(weight.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        extra = []
        for d in range(nd):
            full = (grad_output.shape[2 + d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel[d] - 1) + 1
            extra.append(input.shape[2 + d] - full)
        grad_input = aten.convolution(grad_output, weight, None, stride, padding, dilation, True, extra, 1)
    if output_mask[1]:
        # Batch and channels swap roles; stride and dilation swap too.
        gw = aten.convolution(input.transpose(0, 1), grad_output.transpose(0, 1), None, dilation, padding, stride,
                              False, [0] * nd, 1).transpose(0, 1)
        for d in range(nd):
            gw = gw.narrow(2 + d, 0, kernel[d])
        grad_weight = gw
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *range(2, 2 + nd)])
    return grad_input, grad_weight, grad_bias


def _decompositions(faithful_batch_norm: bool = True) -> dict:
    table = torch.export.default_decompositions()
    table[torch.ops.aten.convolution_backward.default] = _convolution_backward
    if faithful_batch_norm:
        bn = torch.ops.aten._native_batch_norm_legit_functional.default
        table[bn] = torch._decomp.decomposition_table[bn]
    return table


# -- export -----------------------------------------------------------------------------------
class _LossOf(nn.Module):
    def __init__(self, tail: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.tail, self.loss_fn = tail, loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.loss_fn(self.tail(x), y),)


class _Step(nn.Module):
    """Calls the joint graph with parameters and buffers as inputs; returns loss, grads, new buffers."""

    def __init__(self, joint: torch.export.ExportedProgram, params: list[str], buffers: list[str]) -> None:
        super().__init__()
        self.gm = joint.graph_module
        sig = joint.graph_signature
        self.order: list[tuple[str, str]] = []  # (kind, name) per joint input before the user inputs
        self.constants: dict[str, torch.Tensor] = {}
        state = {**joint.state_dict, **joint.constants}
        for spec in sig.input_specs:
            if spec.kind.name == "USER_INPUT":
                continue
            target = spec.target
            if spec.kind.name == "PARAMETER":
                self.order.append(("param", target))
            elif spec.kind.name == "BUFFER" and target in buffers:
                self.order.append(("buffer", target))
            else:  # integer buffers (num_batches_tracked) and lifted constants stay in the graph
                key = f"c{len(self.constants)}"
                self.register_buffer(key, state[target].detach().clone(), persistent=False)
                self.order.append(("const", key))
        outputs = sig.output_specs
        self.loss_at = next(i for i, o in enumerate(outputs) if o.kind.name == "LOSS_OUTPUT")
        grad_at = {o.target: i for i, o in enumerate(outputs) if o.kind.name == "GRADIENT_TO_PARAMETER"}
        new_at = {o.target: i for i, o in enumerate(outputs) if o.kind.name == "BUFFER_MUTATION"}
        self.grad_at = [grad_at[n] for n in params]
        self.new_at = [new_at[n] for n in buffers]
        self.param_names, self.buffer_names = params, buffers

    def forward(self, x: torch.Tensor, y: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        by_name = dict(zip(self.param_names + self.buffer_names, tensors))
        args = [getattr(self, n) if kind == "const" else by_name[n] for kind, n in self.order]
        out = self.gm(*args, x, y)
        return (out[self.loss_at], *(out[i] for i in self.grad_at), *(out[i] for i in self.new_at))


class _Eval(nn.Module):
    """The tail in eval mode with its parameters and buffers as inputs."""

    def __init__(self, tail: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.tail, self.names = tail, names

    def forward(self, x: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.tail, dict(zip(self.names, tensors)), (x,), strict=False)


def tail_names(tail: nn.Module) -> tuple[list[str], list[str]]:
    """Trainable parameters and floating buffers of the tail (names inside the tail module), in the
    order the training graph takes them as inputs: what a caller feeds a graph, and what
    :func:`torch_step` returns gradients and new buffers for."""
    params = [n for n, p in tail.named_parameters() if p.requires_grad]
    buffers = [n for n, b in tail.named_buffers() if b.is_floating_point()]
    return params, buffers


def state_name(model: LayeredModel, split: int, tail_name: str) -> str:
    """The model's state-dict name of a tail entry (``"0.conv1.weight"`` -> ``"blocks.<block>.conv1.weight"``):
    the name of the graph's input for it, and of its ``grad:``/``new:`` output."""
    index, _, rest = tail_name.partition(".")
    return f"blocks.{model.block_names[split + int(index)]}.{rest}"


def _sample(model: LayeredModel, split: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample batch for the tail (the prefix run on random input, in eval mode) and labels."""
    g = torch.Generator().manual_seed(seed)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            x = model.sample_input(batch, generator=g)
            x = model(x, 0, split) if split > 0 else x
    finally:
        for m, training in modes:
            m.training = training
    if model.task == "classification":
        y = torch.randint(0, model.num_outputs, (batch,), generator=g)
    elif model.task == "binary":
        y = torch.randint(0, 2, (batch,), generator=g).float()
    else:
        y = torch.rand(batch, generator=g) * 5
    return x.contiguous(), y


def _onnx(module: nn.Module, args: tuple, names_in: list[str], names_out: list[str], opset: int,
          decompositions: dict, batch_args: int) -> bytes:
    """``module`` as ONNX, after onnxscript's optimizer (constant folding, shape ops and casts of
    the decompositions removed): ResNet20's split-7 step has 517 nodes instead of 924, its session
    opens in 31 ms instead of 66 and holds 2 MiB less. The graph is verified afterwards either way."""
    batch = torch.export.Dim("batch", min=1)
    # The parameters arrive as *tensors: their shapes are one nested tuple.
    shapes = (*({0: batch} for _ in range(batch_args)), tuple(None for _ in args[batch_args:]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        ep = torch.export.export(module, args, dynamic_shapes=shapes)
        ep = ep.run_decompositions(decompositions)
        program = torch.onnx.export(ep, args, None, dynamo=True, opset_version=opset, input_names=names_in,
                                    output_names=names_out, verbose=False, optimize=True)
    return program.model_proto.SerializeToString()


def export_train_graph(model: LayeredModel, split: int, *, settings: TrainExportSettings = TrainExportSettings(),
                       faithful_batch_norm: bool = True, verify: bool = True) -> bytes:
    """The training-graph payload of blocks [split, L) of ``model``, verified against torch.

    Raises :class:`ExportError` for a refused tail (see :func:`train_graph_refusal`), an export
    that fails, or a graph that disagrees with torch. ``faithful_batch_norm=False`` reproduces
    the silent inference-mode BatchNorm lowering (only to show that verification catches it).
    The model's weights and modes are left as they were.
    """
    reason = train_graph_refusal(model, split)
    if reason is not None:
        raise ExportError(f"{model.name} tail [{split}, {len(model)}) is not exported: {reason}")
    tail = model.chunk(split, len(model))
    params, buffers = tail_names(tail)
    saved = {k: v.detach().clone() for k, v in tail.state_dict().items()}
    modes = [(m, m.training) for m in model.modules()]
    table = _decompositions(faithful_batch_norm)
    x, y = _sample(model, split, settings.verify_batch, seed=0)
    try:
        state = dict(tail.named_parameters()) | dict(tail.named_buffers())
        values = tuple(state[n].detach() for n in params + buffers)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            tail.train()
            batch = torch.export.Dim("batch", min=1)
            ep = torch.export.export(_LossOf(tail, model.loss).train(), (x, y),
                                     dynamic_shapes=({0: batch}, {0: batch}))
            joint = torch.export.experimental._export_forward_backward(ep)
        step = _Step(joint, [f"tail.{n}" for n in params], [f"tail.{n}" for n in buffers])
        sp = [state_name(model, split, n) for n in params]
        sb = [state_name(model, split, n) for n in buffers]
        train_bytes = _onnx(step, (x, y, *values), ["input", "target", *sp, *sb],
                            ["loss", *(f"grad:{n}" for n in sp), *(f"new:{n}" for n in sb)],
                            settings.opset, table, batch_args=2)
        tail.eval()
        eval_bytes = _onnx(_Eval(tail, params + buffers), (x, *values), ["input", *sp, *sb], ["output"],
                           settings.opset, table, batch_args=1)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"export of the training graph of {model.name} tail [{split}, {len(model)}) failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for k, v in tail.state_dict().items():
                v.copy_(saved[k])
    graph = TrainGraph(model=model.name, split=split, task=model.task, params=tuple(sp), buffers=tuple(sb),
                       train_onnx=train_bytes, eval_onnx=eval_bytes)
    data = graph.to_bytes()
    if verify:
        verify_train_graph(model, split, data, tolerance=settings.tolerance, batch_size=settings.verify_batch)
    return data


def task_loss(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """LayeredModel.loss in the output's dtype (the model's own casts the target to float32), so that
    the float64 reference of the export check computes the loss in float64 too."""
    if task == "classification":
        return nn.functional.cross_entropy(out, y.long())
    if task == "binary":
        return nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), y.to(out.dtype))
    return nn.functional.mse_loss(out.squeeze(-1), y.to(out.dtype))


def torch_step(tail: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, params: list[str], buffers: list[str]
                ) -> dict[str, np.ndarray]:
    """One train-mode step of ``tail`` in torch autograd (the tail is changed: gradients set, buffers
    moved): the loss, ``grad:<name>`` per parameter and ``new:<name>`` per buffer, as float64 arrays
    named as in the tail (:func:`tail_names`). The export check's reference, and a benchmark's
    (bench/relu_sides.py), run in float32 or, on a ``.double()`` copy, in float64."""
    tail.train()
    for p in tail.parameters():
        p.grad = None
    loss = loss_fn(tail(x), y)
    loss.backward()
    named = dict(tail.named_parameters()) | dict(tail.named_buffers())
    out = {"loss": loss.detach().numpy().astype(np.float64)}
    out |= {f"grad:{n}": named[n].grad.numpy().astype(np.float64) for n in params}
    out |= {f"new:{n}": named[n].detach().numpy().astype(np.float64) for n in buffers}
    return out


#: A ReLU input counts as within float32 rounding of zero up to this fraction of its tensor's largest
#: float64 magnitude (or four times torch float32's own error on that tensor, if larger). ONNX
#: Runtime's and torch's float32 ReLU inputs differ from float64 by at most 2.4e-6 of that magnitude
#: in ResNet20's 19 layers (docs/measurements.md, "Training without torch").
RELU_BAND = 1e-5

_RELUS = (torch.relu, torch.nn.functional.relu, torch.Tensor.relu, torch.relu_, torch.Tensor.relu_)


class _SidedRelu(torch.autograd.Function):
    """ReLU whose derivative is 1 where ``side`` is true: the float64 value forward, a chosen side backward."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(side)
        return z.clamp_min(0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (side,) = ctx.saved_tensors
        return grad * side.to(grad.dtype), None


class ReluSides(TorchFunctionMode):
    """A torch function mode around :func:`torch_step`: records every ReLU's input in call order
    (``inputs``). Given ``graph`` (the graph's own ReLU outputs) and ``float32`` (torch float32's ReLU
    inputs), both in the same order, a unit whose float64 input is within float32 rounding of zero
    (:data:`RELU_BAND`) takes the graph's side: derivative 1 where the graph's output is positive. ``taken`` counts the units where that
    differs from float64's own side."""

    def __init__(self, graph: list[np.ndarray] | None = None, float32: list[np.ndarray] | None = None) -> None:
        super().__init__()
        self.graph, self.float32 = graph or [], float32 or []
        self.inputs: list[np.ndarray] = []
        self.taken = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in _RELUS:
            return func(*args, **(kwargs or {}))
        z = args[0].detach()
        i = len(self.inputs)
        self.inputs.append(z.numpy().astype(np.float64))
        side = z > 0
        if i < len(self.graph) and self.graph[i].shape == tuple(z.shape) and z.numel():
            band = RELU_BAND * float(z.abs().max())
            if i < len(self.float32) and self.float32[i].shape == tuple(z.shape):
                band = max(band, 4 * float(np.abs(self.float32[i] - self.inputs[i]).max()))
            near = z.abs() <= band
            theirs = torch.from_numpy(self.graph[i] > 0)
            self.taken += int((near & (theirs != side)).sum())
            side = torch.where(near, theirs, side)
        return _SidedRelu.apply(args[0], side)


def _graph_relus(train_onnx: bytes, x: np.ndarray, y: np.ndarray, state: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of the training graph's ``Relu`` nodes for one step, in graph order (the forward's order)."""
    model = onnx.load_from_string(train_onnx)
    names = [n.output[0] for n in model.graph.node if n.op_type == "Relu" and n.domain in ("", "ai.onnx")]
    if not names:
        return []
    model.graph.ClearField("output")
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    dtypes = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(double)": np.float64}
    feed = {i.name: np.ascontiguousarray(state[i.name] if i.name in state else x if i.name == "input" else y,
                                         dtype=dtypes.get(i.type, np.float32)) for i in session.get_inputs()}
    return session.run(None, feed)


def verify_train_graph(model: LayeredModel, split: int, data: bytes, *, tolerance: float | None = None,
                       batch_size: int = 4) -> float:
    """Worst error of the graph in ONNX Runtime against torch autograd, in units of the tolerance.

    Compares the loss, every gradient and every new buffer of one training step, and the
    evaluation output, at two batch sizes, with torch run in float64 as the reference. A tensor's
    error is its max absolute difference relative to its largest magnitude (at least 1); it may
    be ``tolerance`` or, where torch's own float32 run is further from float64 than that (deep
    tails with small-batch BatchNorm amplify rounding), four times torch's own error. Where a
    ReLU's float64 input is within float32 rounding of zero (:data:`RELU_BAND`), the float64
    reference takes the graph's side of the kink: its derivative there is not determined in
    float32, and one unit's side can move an earlier layer's gradient by 1e-3. With a
    ``tolerance``, a larger error raises :class:`ExportError` naming the tensor. Returns the worst
    error divided by what was allowed for it (below 1: passed).
    """
    tol = 1e-4 if tolerance is None else tolerance
    tail = model.chunk(split, len(model))
    graph = TrainGraph.from_bytes(data)
    params, buffers = tail_names(tail)
    if list(graph.params) != [state_name(model, split, n) for n in params] or \
            list(graph.buffers) != [state_name(model, split, n) for n in buffers]:
        raise ExportError(f"{model.name} tail [{split}, {len(model)}): the graph's tensors do not match the model's")
    try:
        runner = OrtTail(graph)
    except Exception as exc:
        raise ExportError(f"{model.name} tail [{split}, {len(model)}): ONNX Runtime cannot load the graph: {exc}") from exc
    rename = {n: state_name(model, split, n) for n in params + buffers}
    modes = [(m, m.training) for m in model.modules()]
    saved = {k: v.detach().clone() for k, v in tail.state_dict().items()}
    worst = (0.0, "")
    sided = 0
    try:
        for batch, seed in ((batch_size, 1), (batch_size + 1, 2)):
            x, y = _sample(model, split, batch, seed)
            named = dict(tail.named_parameters()) | dict(tail.named_buffers())
            state = {rename[n]: named[n].detach().numpy().copy() for n in params + buffers}
            loss_g, grads_g, new_g = runner.step(x.numpy(), y.numpy(), state)
            got = {"loss": np.asarray(loss_g), "output (eval)": runner.forward(x.numpy(), state)}
            got |= {f"grad:{n}": grads_g[rename[n]] for n in params}
            got |= {f"new:{n}": new_g[rename[n]] for n in buffers}
            with ReluSides() as float32:
                ref32 = torch_step(tail, lambda o, t: task_loss(model.task, o, t), x, y, params, buffers)
            wide = copy.deepcopy(tail).double()
            with torch.no_grad():
                for k, v in wide.state_dict().items():
                    v.copy_(saved[k])
            sides = ReluSides(_graph_relus(graph.train_onnx, x.numpy(), y.numpy(), state), float32.inputs)
            with sides:
                ref64 = torch_step(wide, lambda o, t: task_loss(model.task, o, t), x.double() if x.is_floating_point()
                                    else x, y.double() if y.is_floating_point() else y, params, buffers)
            sided += sides.taken
            with torch.no_grad():
                for k, v in tail.state_dict().items():
                    v.copy_(saved[k])
                tail.eval()
                wide.eval()
                ref32["output (eval)"] = tail(x).numpy().astype(np.float64)
                ref64["output (eval)"] = wide(x.double() if x.is_floating_point() else x).numpy()
            for p in tail.parameters():
                p.grad = None
            where = f"{model.name} tail [{split}, {len(model)})"
            for key, expected in ref64.items():
                error = _tensor_error(where, key, got[key], expected, ref32[key], tol)
                name = key.split(":", 1)[0] + ":" + rename[key.split(":", 1)[1]] if ":" in key else key
                worst = max(worst, (error[0] / error[1], name))
                if tolerance is not None and not error[0] <= error[1]:
                    raise ExportError(
                        f"{where}: the training graph differs from torch autograd; worst tensor {name!r} off by "
                        f"{error[0]:.3g} (relative; allowed {error[1]:.3g}, torch float32 itself {error[2]:.3g}) at "
                        f"batch {batch}; {sided} ReLU input(s) within float32 rounding of zero took the graph's side")
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for k, v in tail.state_dict().items():
                v.copy_(saved[k])
    return worst[0]


def _tensor_error(where: str, key: str, value: np.ndarray, expected: np.ndarray, own32: np.ndarray,
                  tol: float) -> tuple[float, float, float]:
    """One tensor's error against the float64 reference, relative to its largest magnitude (at least
    1), what is allowed for it (``tol``, or four times torch float32's own error), and that own error."""
    if value.shape != expected.shape:
        raise ExportError(f"{where}: {key} has shape {value.shape} in ONNX Runtime, {expected.shape} in torch")
    scale = max(1.0, float(np.abs(expected).max()) if expected.size else 0.0)
    err = float(np.nan_to_num(np.abs(value.astype(np.float64) - expected), nan=np.inf).max()) / scale \
        if expected.size else 0.0
    own = float(np.abs(own32 - expected).max()) / scale if expected.size else 0.0
    return err, max(tol, 4 * own), own


class TrainGraphCache:
    """Training graphs by content id, in memory and optionally in ``directory`` (``<id>.graph``).

    A graph depends on the model's architecture and split, not its weights, so each is exported
    once per (model, split, loss, settings) and served every round. Refusals are remembered too.
    Thread-safe; exports run one at a time, each on a copy of the model taken when it starts
    (exporting and verifying rewire and re-mode the module they run on): the caller's model,
    which a server's round loop may be reading, is never touched.
    """

    def __init__(self, directory: Path | str | None = None, *,
                 settings: TrainExportSettings = TrainExportSettings()) -> None:
        self.settings = settings
        self.directory = Path(directory) if directory is not None else None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._graphs: dict[str, bytes] = {}
        self._refused: dict[str, str] = {}
        self._lock = threading.Lock()
        self.exports = 0

    def graph_id(self, model: LayeredModel, split: int) -> str:
        return train_graph_id(model.name, split, model.task, self.settings, getattr(model, "width", 1.0),
                              architecture_id(model))

    def get_or_export(self, model: LayeredModel, split: int) -> tuple[str, bytes]:
        """The id and payload of the training graph of [split, L); raises ExportError if refused."""
        gid = self.graph_id(model, split)
        with self._lock:
            if gid in self._graphs:
                return gid, self._graphs[gid]
            reason = self._refused.get(gid) or self._load_refusal(gid)
            if reason is not None:
                self._refused[gid] = reason
                raise ExportError(reason)
            data = self._load(gid)
            if data is None:
                try:
                    data = export_train_graph(copy.deepcopy(model), split, settings=self.settings)
                except ExportError as exc:
                    self._refused[gid] = str(exc)
                    if self.directory is not None:  # a refusal is as deterministic as a graph: kept too
                        atomic_write(self.directory / f"{gid}.refused", str(exc).encode())
                    raise
                self.exports += 1
                if self.directory is not None:
                    atomic_write(self.directory / f"{gid}.graph", data)
                    atomic_write(self.directory / f"{gid}.sha256", hashlib.sha256(data).hexdigest().encode())
            self._graphs[gid] = data
            return gid, data

    def refusal(self, model: LayeredModel, split: int) -> str | None:
        """Why [split, L) has no shippable graph (a static refusal, or its export check failed), or
        None once its graph is exported and verified. Exports on first use (seconds), so planners
        call it off the event loop; both outcomes are cached."""
        reason = train_graph_refusal(model, split)
        if reason is not None:
            return reason
        try:
            self.get_or_export(model, split)
        except ExportError as exc:
            return str(exc)
        return None

    def known_refusal(self, model: LayeredModel, split: int) -> str | None:
        """A refusal already recorded for [split, L) (never exports)."""
        gid = self.graph_id(model, split)
        with self._lock:
            return self._refused.get(gid) or self._load_refusal(gid)

    def _load_refusal(self, gid: str) -> str | None:
        if self.directory is None:
            return None
        try:
            return (self.directory / f"{gid}.refused").read_text() or "refused"
        except OSError:
            return None

    def get(self, gid: str) -> bytes | None:
        with self._lock:
            return self._graphs.get(gid) or self._load(gid)

    def _load(self, gid: str) -> bytes | None:
        if self.directory is None:
            return None
        try:
            data = (self.directory / f"{gid}.graph").read_bytes()
            digest = (self.directory / f"{gid}.sha256").read_text().strip()
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == digest else None

