"""Local training without torch: a tail's training step as an ONNX graph run by ONNX Runtime.

The server exports the graph once per (model, split) (exporters.train_export) and verifies it
against torch autograd before any device sees it. The graph computes the loss, one gradient per
trainable parameter and the new BatchNorm statistics; the update itself is numpy here, step for
step the rule of ``edge_sdk.trainer.MomentumSGD`` (momentum, weight decay, FedProx's proximal
term). The mini-batches come from ``edge_sdk.training.sample_plan``, so from the same state, data
and seed this trainer and the torch one return the same deltas up to float32 rounding.

A device process that trains this way imports numpy and onnxruntime, never torch: about 55 MiB
of runtime where torch takes 267 (profiles.runtime), which the planner turns into a larger tail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack
import numpy as np
import onnxruntime as ort

from edge_sdk.forward import take_rows
from edge_sdk.memory import release_memory
from edge_sdk.protocol import RowSparse
from edge_sdk.training import TrainConfig, TrainResult, sample_plan

__all__ = ["GRAPH_FORMAT", "OrtTail", "TrainGraph", "evaluate_tail_ort", "train_tail_ort", "warm_up"]

#: Version of the payload layout below (a msgpack map); bumped when it changes.
GRAPH_FORMAT = 1


@dataclass(frozen=True)
class TrainGraph:
    """The payload a device receives: the training step and the evaluation forward of one tail.

    ``params`` and ``buffers`` are state names (as in the model's state dict), in the order of
    the graphs' inputs after ``input`` (and ``target``); ``buffers`` are the floating ones.
    ``frozen`` (after them) are parameters the step reads but does not train: the weights under a
    block's adapters when the tail trains through its adapters (edge_sdk.models.adapters). Only
    ``params`` and ``buffers`` change, so only they have deltas.
    """

    model: str
    split: int
    task: str
    params: tuple[str, ...]
    buffers: tuple[str, ...]
    train_onnx: bytes
    eval_onnx: bytes
    frozen: tuple[str, ...] = ()

    @property
    def trained(self) -> tuple[str, ...]:
        """The entries a step changes: what a device's update holds."""
        return (*self.params, *self.buffers)

    def to_bytes(self) -> bytes:
        fields = {
            "format": GRAPH_FORMAT, "model": self.model, "split": self.split, "task": self.task,
            "params": list(self.params), "buffers": list(self.buffers), "train": self.train_onnx,
            "eval": self.eval_onnx,
        }
        if self.frozen:  # absent otherwise: a whole tail's graph reads as before
            fields["frozen"] = list(self.frozen)
        return msgpack.packb(fields, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> TrainGraph:
        try:
            obj = msgpack.unpackb(bytes(data), raw=False)
            if obj.get("format") != GRAPH_FORMAT:
                raise ValueError(f"training graph format {obj.get('format')!r}, this device reads {GRAPH_FORMAT}")
            return cls(str(obj["model"]), int(obj["split"]), str(obj["task"]), tuple(obj["params"]),
                       tuple(obj["buffers"]), bytes(obj["train"]), bytes(obj["eval"]), tuple(obj.get("frozen", ())))
        except (KeyError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a training graph payload: {exc}") from exc


def _session(onnx_bytes: bytes, threads: int) -> ort.InferenceSession:
    # The same small-device settings as edge_sdk.forward.ChunkRunner.
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_mem_pattern = False
    options.log_severity_level = 3
    return ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32}


class OrtTail:
    """A tail's two graphs in ONNX Runtime sessions; the weights are passed in on every call.

    Both graphs are opened here (a graph ONNX Runtime cannot load fails at once). Each session
    keeps a memory arena as large as its largest run, so :func:`train_tail_ort` holds one session
    at a time: it drops the evaluation session while it trains and the training session once it
    has trained (:meth:`release`); a session dropped is opened again on its next use (the
    evaluation graph in about 3 ms, the training graph in 30-70 ms).
    """

    def __init__(self, graph: TrainGraph, *, threads: int = 1) -> None:
        self.graph = graph
        self.threads = threads
        self._train: ort.InferenceSession | None = _session(graph.train_onnx, threads)
        self._eval: ort.InferenceSession | None = _session(graph.eval_onnx, threads)
        inputs = {i.name: i for i in self._train.get_inputs()}
        self._x_dtype = _ORT_TYPES.get(inputs["input"].type, np.float32)
        self._y_dtype = _ORT_TYPES.get(inputs["target"].type, np.float32)
        self._outputs = [o.name for o in self._train.get_outputs()]

    @property
    def names(self) -> tuple[str, ...]:
        """Every state entry the graphs read, in their input order."""
        return (*self.graph.params, *self.graph.buffers, *self.graph.frozen)

    def release(self, which: str = "both") -> None:
        """Drop the ``"train"`` or ``"eval"`` session (or both) with its memory arena."""
        if which not in ("train", "eval", "both"):
            raise ValueError(f"which must be train, eval or both, not {which!r}")
        if which in ("train", "both"):
            self._train = None
        if which in ("eval", "both"):
            self._eval = None

    def _feed(self, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: np.ascontiguousarray(state[n], dtype=np.float32) for n in self.names}

    def step(self, x: np.ndarray, y: np.ndarray, state: Mapping[str, np.ndarray]
             ) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """One training step's loss, gradients (by parameter) and new buffers; ``state`` is not changed."""
        if self._train is None:
            self._train = _session(self.graph.train_onnx, self.threads)
        feed = self._feed(state)
        feed["input"] = np.ascontiguousarray(x, dtype=self._x_dtype)
        feed["target"] = np.ascontiguousarray(y, dtype=self._y_dtype)
        out = self._train.run(None, feed)
        p = len(self.graph.params)
        grads = dict(zip(self.graph.params, out[1 : 1 + p]))
        new = dict(zip(self.graph.buffers, out[1 + p :]))
        return float(out[0]), grads, new

    def forward(self, x: np.ndarray, state: Mapping[str, np.ndarray]) -> np.ndarray:
        """The tail's output in eval mode (BatchNorm on its running statistics)."""
        if self._eval is None:
            self._eval = _session(self.graph.eval_onnx, self.threads)
        feed = self._feed(state)
        feed["input"] = np.ascontiguousarray(x, dtype=self._x_dtype)
        return self._eval.run(None, feed)[0]


def task_loss(task: str, output: np.ndarray, y: np.ndarray) -> float:
    """The mean loss of ``LayeredModel.loss`` for ``task``, in numpy (float64)."""
    out = np.asarray(output, np.float64)
    if task == "classification":
        shifted = out - out.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(y)), np.asarray(y, np.int64)].mean())
    z, t = out.reshape(len(out)), np.asarray(y, np.float64)
    if task == "binary":
        return float((np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))).mean())
    if task == "regression":
        return float(((z - t) ** 2).mean())
    raise ValueError(f"unknown task {task!r}")


def _mean_loss(tail: OrtTail, state: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray, idx: np.ndarray,
               batch: int) -> float:
    total = 0.0
    for i in range(0, len(idx), batch):
        rows = idx[i : i + batch]
        total += task_loss(tail.graph.task, tail.forward(take_rows(x, rows), state), y[rows]) * len(rows)
    return total / max(len(idx), 1)


def _dense(state: Mapping[str, np.ndarray | RowSparse], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    missing = [n for n in names if n not in state]
    if missing:
        raise ValueError(f"the received state lacks {missing[:5]}")
    out = {}
    for n in names:
        v = state[n]
        if isinstance(v, RowSparse):
            raise ValueError(f"{n} is row-sparse: a training graph trains dense tails only")
        out[n] = np.asarray(v)
    return out


def evaluate_tail_ort(tail: OrtTail, state: Mapping[str, np.ndarray | RowSparse], x: np.ndarray, y: np.ndarray,
                      config: TrainConfig) -> dict[str, float]:
    """Loss (and accuracy, for classification) on up to ``eval_samples`` local samples, as evaluate_tail."""
    weights = _dense(state, tail.names)
    idx = np.sort(np.random.default_rng(config.seed).permutation(len(x))[: config.eval_samples])
    out = {"loss": _mean_loss(tail, weights, x, y, idx, config.batch_size)}
    if tail.graph.task == "classification":
        correct = 0
        for i in range(0, len(idx), config.batch_size):
            rows = idx[i : i + config.batch_size]
            correct += int((tail.forward(take_rows(x, rows), weights).argmax(1) == np.asarray(y[rows])).sum())
        out["accuracy"] = correct / max(len(idx), 1)
    return out


def train_tail_ort(tail: OrtTail, state: Mapping[str, np.ndarray | RowSparse], x: np.ndarray, y: np.ndarray,
                   config: TrainConfig) -> TrainResult:
    """tau local steps of momentum SGD on the tail from ``state``; deltas (new - received) per floating entry.

    The update rule is ``edge_sdk.trainer.MomentumSGD``'s: b_1 = g_1 + wd w, b_t = mu b_(t-1) + g_t + wd w,
    w <- w - lr b_t (without momentum: w <- w (1 - lr wd) - lr g), with g += prox_mu (w - w_received).
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need matching, non-empty inputs and labels (got {len(x)} and {len(y)})")
    initial = _dense(state, tail.names)
    # Our copies of what training changes; frozen weights (under adapters) are read where they lie.
    weights = {n: np.array(initial[n], dtype=np.float32, copy=True) for n in tail.graph.trained}
    weights |= {n: initial[n] for n in tail.graph.frozen}
    eval_idx, batches = sample_plan(len(x), config)
    loss_before = _mean_loss(tail, weights, x, y, eval_idx, config.batch_size)
    tail.release("eval")  # one session's arena at a time (OrtTail)
    lr, mu, wd, prox = np.float32(config.lr), np.float32(config.momentum), np.float32(config.weight_decay), \
        np.float32(config.prox_mu)
    momentum: dict[str, np.ndarray] = {}
    # One scratch buffer the size of the largest parameter: the update makes no other temporaries.
    scratch = np.empty(max((weights[n].size for n in tail.graph.params), default=0), np.float32)
    step_losses = 0.0
    for idx in batches:
        loss, grads, new = tail.step(take_rows(x, idx), y[idx], weights)
        if not math.isfinite(loss):
            raise FloatingPointError(f"local loss became {loss}; lower the learning rate")
        step_losses += loss
        for n in tail.graph.params:
            w, g = weights[n], grads[n]
            tmp = scratch[: w.size].reshape(w.shape)
            if prox > 0:  # g += prox (w - w_received)
                np.subtract(w, initial[n], out=tmp)
                tmp *= prox
                g += tmp
            if not mu:
                if wd:
                    w *= 1 - lr * wd
                np.multiply(g, lr, out=tmp)
                w -= tmp
                continue
            buf = momentum.get(n)
            if buf is None:
                # Our own copy: an output array of ONNX Runtime keeps its session's whole memory
                # arena alive (even after the session is dropped) for as long as it lives.
                buf = momentum[n] = g.copy()
            else:
                buf *= mu
                buf += g
            if wd:
                np.multiply(w, wd, out=tmp)
                buf += tmp
            np.multiply(buf, lr, out=tmp)
            w -= tmp
        del grads
        for n in tail.graph.buffers:
            np.copyto(weights[n], new[n])  # into our arrays: holding ONNX Runtime's keeps its arena
        del new
    momentum.clear()
    tail.release("train")
    release_memory()
    loss_after = _mean_loss(tail, weights, x, y, eval_idx, config.batch_size) if config.loss_after else math.nan
    deltas = {}
    for n in tail.graph.trained:
        w = weights[n]
        np.subtract(w, initial[n], out=w)
        deltas[n] = w
    return TrainResult(deltas, len(x), loss_before, loss_after, config.local_steps,
                       step_losses / len(batches) if batches else math.nan)


def warm_up(threads: int = 1) -> None:
    """Load what a training device loads beyond its modules: an ONNX Runtime session and its
    first run (profiles.runtime measures the process after this). The training graphs use the
    same CPU kernels as the frozen chunks.
    """
    from edge_sdk.forward import warm_up as forward_warm_up

    forward_warm_up()
