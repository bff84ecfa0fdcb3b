"""Export a range of blocks of a layered model to ONNX, frozen, with a dynamic batch axis.

A weak device runs the frozen input-side blocks as ONNX chunks in ONNX Runtime (EmbracingFL,
Algorithm 1); this module makes those chunks and checks each one against torch before it ships.

Exporter choice, with torch 2.13 / onnx 1.23 / onnxruntime 1.31 (docs/measurements.md, "ONNX export of layer
chunks"): both exporters export every zoo model (convolutions with BatchNorm, max-pool, LSTM,
embeddings, linear layers) with a dynamic batch and match torch to about 1e-7. The default is the
TorchScript ("legacy") exporter because chunks are exported again every round (the weights change)
and it takes 0.01-0.15 s per chunk where the torch.export-based ("dynamo") exporter takes 0.4-5 s;
the graphs are the same. The legacy exporter is deprecated, so "dynamo" is supported and tested
too and is the one to switch to when it goes. Both export opset 18: the lowest opset the dynamo
exporter implements natively (a lower one goes through a lossy version converter), and one that
onnxruntime has run since 1.14, so older device runtimes load the chunks.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch

from edge_sdk.forward import ChunkRunner
from edge_sdk.models.layered import LayeredModel

__all__ = ["ChunkIO", "ExportError", "ExportSettings", "chunk_io", "export_chunk", "verify_chunk"]

EXPORTERS = ("legacy", "dynamo")
INPUT_NAME = "input"
OUTPUT_NAME = "output"


class ExportError(RuntimeError):
    """A chunk could not be exported, or its ONNX does not compute what the torch blocks compute."""


@dataclass(frozen=True)
class ExportSettings:
    """How chunks are exported and checked; part of a chunk's content address (see exporters.cache).

    ``tolerance`` bounds the max difference between ONNX Runtime and torch eval on a sample batch
    of ``verify_batch`` samples (and on a batch of one, which catches a batch axis that the
    exporter fixed instead of leaving dynamic), relative to the largest activation when that
    exceeds 1: float32 sums of activations of magnitude 10 differ by more than 1e-4 between two
    correct kernels (ResNet20's stage-1 chunks after training did), and a bound that rejects those
    rejects correct chunks.
    """

    exporter: str = "legacy"
    opset: int = 18
    tolerance: float = 1e-4
    verify_batch: int = 4

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(f"exporter must be one of {EXPORTERS}, got {self.exporter!r}")
        if not isinstance(self.opset, int) or not 13 <= self.opset <= 23:
            raise ValueError(f"opset must be an integer in [13, 23], got {self.opset!r}")
        if not (isinstance(self.tolerance, (int, float)) and math.isfinite(self.tolerance) and self.tolerance > 0):
            raise ValueError(f"tolerance must be a positive number, got {self.tolerance!r}")
        # torch.export specialises a batch of 1 to a constant, so the sample batch must be larger.
        if not isinstance(self.verify_batch, int) or self.verify_batch < 2:
            raise ValueError(f"verify_batch must be an integer >= 2, got {self.verify_batch!r}")

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ChunkIO:
    """Per-sample input and output shapes and numpy dtype names of blocks [start, stop)."""

    input_shape: tuple[int, ...]
    input_dtype: str
    output_shape: tuple[int, ...]
    output_dtype: str


def _numpy_dtype_name(dtype: torch.dtype) -> str:
    return str(torch.empty((), dtype=dtype).numpy().dtype)


@contextmanager
def _frozen(model: LayeredModel) -> Iterator[None]:
    """Eval mode (BatchNorm on running statistics, dropout off) and no autograd; restores modes after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


def _sample(model: LayeredModel, start: int, batch: int, seed: int = 0) -> torch.Tensor:
    """A sample input of blocks [start, ...): the model's prefix [0, start) run on a random batch."""
    generator = torch.Generator().manual_seed(seed)
    x = model.sample_input(batch, generator=generator)
    return model(x, 0, start) if start > 0 else x


def chunk_io(model: LayeredModel, start: int, stop: int) -> ChunkIO:
    """Shapes and dtypes flowing in and out of blocks [start, stop), found by running the prefix."""
    model._check_range(start, stop)
    with _frozen(model):
        x = _sample(model, start, 2)
        y = model(x, start, stop)
    return ChunkIO(tuple(x.shape[1:]), _numpy_dtype_name(x.dtype), tuple(y.shape[1:]), _numpy_dtype_name(y.dtype))


def _export_legacy(chunk: torch.nn.Module, sample: torch.Tensor, opset: int) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*legacy TorchScript.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*will be removed.*")
        # The tracer warns that shape checks (LSTM) and an LSTM's batch may be fixed in the trace;
        # verify_chunk runs every chunk at two batch sizes, which is what those warnings ask for.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=UserWarning, message=".*batch_size other than 1.*LSTM.*")
        torch.onnx.export(
            chunk,
            (sample,),
            buffer,
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            do_constant_folding=True,
        )
    return buffer.getvalue()


def _export_dynamo(chunk: torch.nn.Module, sample: torch.Tensor, opset: int) -> bytes:
    # f=None keeps the weights inside the returned model (no external .onnx.data file), and the
    # dynamic batch is given positionally: the keyword form fails on nn.Sequential, whose
    # argument is named `input` (docs/measurements.md).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")  # torch-internal
        program = torch.onnx.export(
            chunk,
            (sample,),
            None,
            dynamo=True,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            verbose=False,
        )
    return program.model_proto.SerializeToString()


def export_chunk(
    model: LayeredModel, start: int, stop: int, *, settings: ExportSettings = ExportSettings()
) -> bytes:
    """Blocks [start, stop) of ``model`` as self-contained ONNX bytes, verified against torch.

    The chunk is exported in eval mode; the model's train/eval modes are restored afterwards.
    Raises :class:`ExportError` when the exporter fails or the result differs from torch by more
    than ``settings.tolerance``.
    """
    model._check_range(start, stop)
    chunk = model.chunk(start, stop)
    with _frozen(model):
        chunk.eval()  # the Sequential wrapper itself; its blocks are already in eval mode
        sample = _sample(model, start, settings.verify_batch)
        try:
            if settings.exporter == "legacy":
                onnx_bytes = _export_legacy(chunk, sample, settings.opset)
            else:
                onnx_bytes = _export_dynamo(chunk, sample, settings.opset)
        except Exception as exc:
            raise ExportError(
                f"{settings.exporter} export of {model.name} blocks [{start}, {stop}) failed: {exc}"
            ) from exc
    verify_chunk(model, start, stop, onnx_bytes, tolerance=settings.tolerance, batch_size=settings.verify_batch)
    return onnx_bytes


def verify_chunk(
    model: LayeredModel,
    start: int,
    stop: int,
    onnx_bytes: bytes,
    *,
    tolerance: float | None = None,
    batch_size: int = 4,
) -> float:
    """Max absolute difference between the ONNX chunk in onnxruntime and torch eval of the blocks.

    Checked on a sample batch of ``batch_size`` and on a batch of one. With a ``tolerance``, a
    larger difference (or a NaN/Inf where torch has a finite value) raises :class:`ExportError`.
    """
    model._check_range(start, stop)
    try:
        runner = ChunkRunner(onnx_bytes)
    except ValueError as exc:
        raise ExportError(f"{model.name} blocks [{start}, {stop}): {exc}") from exc
    worst = 0.0
    try:
        for batch in (batch_size, 1):
            with _frozen(model):
                x = _sample(model, start, batch, seed=1)
                expected = model(x, start, stop).numpy()
            if tolerance is not None and not np.isfinite(expected).all():
                raise ExportError(f"{model.name} blocks [{start}, {stop}): torch eval itself is not finite at "
                                  f"batch {batch}: the weights cannot be served")
            got = runner.run(x.numpy())
            if got.shape != expected.shape:
                raise ExportError(
                    f"{model.name} blocks [{start}, {stop}): ONNX output shape {got.shape} "
                    f"differs from torch {expected.shape} at batch {batch}"
                )
            diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
            diff = float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0
            worst = max(worst, diff)
            scale = float(np.abs(expected).max()) if expected.size else 1.0
            if tolerance is not None and not diff <= tolerance * max(1.0, scale):
                raise ExportError(
                    f"{model.name} blocks [{start}, {stop}): ONNX Runtime differs from torch eval by "
                    f"{diff:.3g} (tolerance {tolerance:.3g} x max(1, {scale:.3g})) at batch {batch}"
                )
    finally:
        runner.close()
    return worst
