"""Memory accounting of a layered model, block by block, measured from the real modules.

Two activation counts are kept per block, for two different questions.

``activations``: the paper's count, for *capacity*
    The outputs of the layers that carry weights and pass an error signal back: every
    ``nn.Conv*``, ``nn.Linear`` (or adapted linear) and recurrent layer (``nn.LSTM``/``nn.GRU``/``nn.RNN``: its output
    sequence), per sample, read by forward hooks on the leaf modules. Embedding lookups,
    normalization, pooling and element-wise ops are not counted. This is the rule that
    reproduces EmbracingFL Table 1: its ResNet20 numbers are exactly 32 x the conv and dense
    outputs of one sample (a batch of 32), its FEMNIST CNN numbers exactly the conv and dense
    outputs of one sample, and its IMDB moderate client (embedding frozen) keeps as many
    activations as the strong one, so embedding outputs do not count. (The paper's ResNet20 also
    has a 1x1 projection shortcut in its first stage: 288 more parameters and one more 16x32x32
    output per sample than the zoo's, which is how Table 1 gets 272,762 and 6,947,136.) Its IMDB
    count, 1,310,720, is ten times the BiLSTM's output sequence of one sample (256 steps x 512);
    the paper does not say which ten tensors, so this rule counts the sequence once.

``saved_*``: what training really holds, for the *footprint* in bytes
    Every tensor autograd stores for the backward pass (``torch.autograd.graph.saved_tensors_hooks``)
    during a training-mode forward, counted once per storage, leaving out parameters and
    buffers (counted as state) and the block's input (the previous block's output, or the
    cached input of the trained suffix). For a conv-BN-ReLU stack that is the conv input, the BN
    input, the ReLU output and BN's per-channel batch statistics; for max-pooling its int64
    indices; for dropout its mask. Measured at two batch sizes, it splits into a per-sample part
    and a batch-independent part (BN statistics).

``attention_elements``: the attention matrices, context squared per head
    A self-attention layer's softmax(Q K^T / sqrt(d) + M) is heads x T x T per sample for a context
    of T: quadratic in the context where everything else in a transformer block is linear. It is
    kept for the backward pass (softmax's and the weighted sum's), and while it is computed the
    scores and the weights are both alive. Read from the softmax calls over the last axis of a
    square matrix during the measured forward pass; counted in a block's activations (the paper's
    a: what training keeps), in its inference working set (scores + weights) and in its training
    working set (weights, their gradient and the scores' gradient), beside what autograd saves.

Capacity follows EmbracingFL Section 4, "Client Capacity Settings": C = (2p + 2a) / (2P + 2A), with
p, a the trainable parameters and kept activations of the trained suffix and P, A those of the
whole model.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported only to measure a model
    from torch import nn

    from edge_sdk.models.layered import LayeredModel

__all__ = [
    "BlockCost",
    "DTYPE_SIZES",
    "SECURE_ROUND_BYTES",
    "TableCost",
    "Footprint",
    "ModelCost",
    "TrainingMemory",
    "measure_model",
]

#: Bytes per element of the floating dtypes a device may train in.
DTYPE_SIZES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

_MiB = 1024 * 1024

#: What a device's first secure round adds to its process (``TrainingMemory.secure_bytes``).
#: Measured on the project's machine (Python 3.12, cryptography 46): importing the secure round's
#: modules and running its first key agreement and mask slice grows a device's RSS by 9.9 MiB; a
#: slice's temporaries (65,536 coordinates: float64 values, rounding, noise draws, the mask's
#: keystreams) take up to 6 MiB more.
SECURE_ROUND_BYTES = 16 * _MiB

# The batch sizes at which a model is measured: two, so that per-sample and batch-independent
# parts separate (not one: BatchNorm1d refuses a batch of one in training mode).
_MEASURE_BATCHES = (2, 4)


@dataclass(frozen=True)
class TrainingMemory:
    """How a device trains, as far as memory goes.

    ``optimizer_copies``: extra copies of the trainable parameters the optimizer keeps: 0 for
    plain SGD, 1 for SGD with momentum (the default), 2 for Adam.

    ``frozen_copies``: copies of a frozen chunk's weights held while it runs: the serialized
    ONNX bytes, the model ONNX Runtime parses from them, and its initializer tensors. Measured on
    the project's machine (onnxruntime 1.31.1): a session made from the 24.5 MiB bytes of the LEAF
    CNN's dense1 block grows RSS by 82 MiB, about 3 x the weights + the session cost.

    ``session_bytes``: ONNX Runtime's fixed cost of one session and its first run, beyond the
    chunk's weights and activations. Measured there too: a session for a 650-parameter chunk
    grows RSS by 8.6 MiB, and its first batch-32 run by 8 MiB more.

    ``process_bytes``: what a device process holds beyond its runtimes and its model: the
    websocket connection's buffers (frames in flight both ways), the worker thread that trains,
    the event loop, allocator slack. Measured on the project's machine: emulated ResNet20 devices
    peaked 13-18 MiB above the same round run in a bare process.

    ``sequential_phases``: a device streams its frozen chunks first (each chunk is freed before
    the next loads), then trains the tail (docs/architecture.md, "One round, step by step"); its peak is the
    larger of the two phases. Set it to False for a device that must hold both at once.

    ``transfer_copies``: copies of the tail's state held for the wire while the tail trains: the
    received tail payload, which the deltas are taken against (edge_sdk.trainer then writes the
    deltas over the trained weights and encodes them once the optimizer is gone, so the upload
    never costs more than training did).

    ``upload_copies``: copies of the tail's values held beside the tail while its update goes out
    (after training, the optimizer gone): the encoded frame (1). A secure round holds its masked
    words too (2, :meth:`secured`).

    ``secure_bytes``: what a secure round adds to the device process for the rest of its life:
    the cryptography library and the secure-aggregation modules, imported on the first secure
    round, and one slice's temporaries (the device masks a slice at a time, edge_sdk.secagg.round).
    0 for a plain run; :meth:`secured` sets the measured figure.

    ``delta_copies`` and ``delta_bits``: where the server sends delta downloads (``download_delta``,
    :meth:`with_deltas`), a device rebuilds each changed chunk and tail from the quantized difference
    (``delta_bits`` a weight) on the version it holds, and holds three copies of the payload's weights
    while it does (:func:`edge_sdk.codecs.delta.apply_delta` and the JavaScript ``applyDelta``: the base,
    the decoded step, the result, written in place). A chunk's rebuild comes before its session, so a
    chunk costs the larger of the two; a tail's comes before training, which holds more copies of it
    (:attr:`param_copies` and ``transfer_copies``). 0 where downloads travel whole.

    ``codec_bytes`` and ``codec_bits``: what encoding the update holds beside the tail's values and
    the frame while it goes out (:meth:`with_update_codec`): fixed bytes, and bits per value sent.
    EDEN's rotation works a bounded slice of segments at a time (:data:`edge_sdk.codecs.eden.SLICE`),
    so its workspace is fixed (:func:`edge_sdk.codecs.eden.workspace_bytes`), beside the record's
    packed rotation signs (2 bits a value). 0 where updates travel through a codec declaring none.

    ``margin``: a share added to the model's bytes for what the accounting does not itemise
    (allocator slack, temporaries of the loss and the optimizer step). Measured on torch 2.13:
    the peak RSS growth of a ResNet20 training step (splits 0, 4, 7; batches 32 and 128) was
    65-95% of the itemised bytes, varying by up to 10% from run to run.
    """

    dtype: str = "float32"
    optimizer_copies: int = 1
    transfer_copies: int = 1
    frozen_copies: int = 3
    session_bytes: int = 16 * _MiB
    process_bytes: int = 24 * _MiB
    sequential_phases: bool = True
    margin: float = 0.10
    #: Extra copies of the trainable parameters a device on the ONNX Runtime backend holds: the
    #: gradients come out of the session's buffers into new numpy arrays each step.
    graph_copies: int = 1
    upload_copies: int = 1
    secure_bytes: int = 0
    delta_copies: int = 0
    delta_bits: int = 0
    codec_bytes: int = 0
    codec_bits: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPE_SIZES)}")
        if self.optimizer_copies < 0:
            raise ValueError(f"optimizer_copies must be >= 0, not {self.optimizer_copies}")
        if self.transfer_copies < 0:
            raise ValueError(f"transfer_copies must be >= 0, not {self.transfer_copies}")
        if self.frozen_copies < 1:
            raise ValueError(f"frozen_copies must be >= 1, not {self.frozen_copies}")
        if self.process_bytes < 0:
            raise ValueError(f"process_bytes must be >= 0, not {self.process_bytes}")
        if self.session_bytes < 0:
            raise ValueError(f"session_bytes must be >= 0, not {self.session_bytes}")
        if self.upload_copies < 0 or self.secure_bytes < 0:
            raise ValueError(f"upload_copies and secure_bytes must be >= 0, not {self.upload_copies}, "
                             f"{self.secure_bytes}")
        if self.delta_copies < 0 or self.delta_bits not in (0, 2, 4, 8):
            raise ValueError(f"delta_copies must be >= 0 and delta_bits 0, 2, 4 or 8, not {self.delta_copies}, "
                             f"{self.delta_bits}")
        if self.codec_bytes < 0 or self.codec_bits < 0:
            raise ValueError(f"codec_bytes and codec_bits must be >= 0, not {self.codec_bytes}, {self.codec_bits}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), not {self.margin}")

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    def secured(self) -> TrainingMemory:
        """This memory in a secure round (``secure_aggregation``): the masked words held beside the
        frame while uploading, and :data:`SECURE_ROUND_BYTES` for the rest of the process's life."""
        return dataclasses.replace(self, upload_copies=self.upload_copies + 1, secure_bytes=SECURE_ROUND_BYTES)

    def with_deltas(self, bits: int) -> TrainingMemory:
        """This memory where chunks and tails travel as ``bits``-bit delta downloads (0: whole)."""
        return dataclasses.replace(self, delta_copies=3 if bits else 0, delta_bits=bits)

    def with_update_codec(self, name: str) -> TrainingMemory:
        """This memory where updates travel through codec ``name`` (the server's resolved ``update_codec``):
        the workspace its encoding declares (:meth:`edge_sdk.codecs.base.Codec.workspace`)."""
        from edge_sdk.codecs import codec

        fixed, bits = codec(name).workspace()
        return dataclasses.replace(self, codec_bytes=fixed, codec_bits=bits)

    @property
    def param_copies(self) -> int:
        """Copies of each trainable parameter: the weight, its gradient, the optimizer state."""
        return 2 + self.optimizer_copies


@dataclass(frozen=True)
class BlockCost:
    """What one block costs. Counts marked "per sample" scale with the batch size."""

    index: int
    name: str
    trainable_params: int  # parameters with requires_grad
    frozen_params: int  # parameters without requires_grad
    buffers: int  # buffer elements (BatchNorm running statistics): held, never trained
    activations: int  # per sample: outputs of conv / linear / recurrent layers (the paper's a)
    saved_elements: int  # per sample: floating elements autograd keeps for backward
    saved_fixed_elements: int  # per batch of any size: floating elements kept for backward
    saved_other_bytes: int  # per sample: non-floating saved bytes (pooling indices, masks)
    input_saved: bool  # backward keeps this block's input, and the previous block does not
    input_elements: int  # per sample
    output_elements: int  # per sample
    peak_elements: int  # per sample: the largest leaf module's input + output (inference)
    train_peak_elements: int  # per sample: the same plus a convolution's unfolded patches (x2)
    sparse: bool = False  # an embedding table fetched by rows (counted in full here)
    attention_elements: int = 0  # per sample: attention matrices (heads x context^2 per attention layer)
    adapted: bool = False  # the block has LoRA adapters (edge_sdk.models.adapters)
    adapter_params: int = 0  # trained through its adapters: the adapters and the parameters outside adapted layers
    adapter_saved_elements: int = 0  # per sample: what autograd keeps when trained through its adapters

    def trained_params(self, adapters: bool = False) -> int:
        """Parameters trained: all trainable ones, or (``adapters``) those of training through adapters."""
        return self.adapter_params if adapters and self.adapted else self.trainable_params

    def saved(self, adapters: bool = False) -> int:
        """Floating elements per sample autograd keeps, trained whole or through adapters."""
        return self.adapter_saved_elements if adapters and self.adapted else self.saved_elements

    @property
    def params(self) -> int:
        return self.trainable_params + self.frozen_params


@dataclass(frozen=True)
class TableCost:
    """A sparse table a device may hold only rows of (FedSubAvg submodels).

    ``entry`` is its state-dict name, ``block`` the block that owns it, ``rows`` the table's rows
    and ``row_elements`` the elements of one row.
    """

    entry: str
    block: int
    rows: int
    row_elements: int


@dataclass(frozen=True)
class Footprint:
    """Bytes a device holds for one split, part by part, and its peak.

    A device has two phases: it streams the frozen chunks through ONNX Runtime, holding one
    chunk and the tail's weights at a time (``streaming``); then it trains the tail on the
    cached activations (``training``). With ``sequential`` phases the peak is the larger of the
    two, otherwise their sum. After training, with the optimizer gone, the update goes out
    (``upload``): the tail's values and their encoded frame, and in a secure round the masked
    words too; that phase counts when it is the largest. The runtime is held throughout.
    """

    split: int
    batch: int
    trainable_state: int  # trainable params x (weight + grad + optimizer + transfer copies), tail buffers
    activations: int  # saved for backward for one batch, plus backward's working set
    cached_input: int  # the tail's input (block k-1 output) for every local sample, or one batch
    frozen_chunk: int  # the largest frozen chunk: ORT session, weights, one batch through it
    tail_weights: int  # the tail's weights and buffers, kept while the chunks stream
    runtime: int  # the Python process with its runtimes imported (torch + ONNX Runtime)
    local_data: int = 0  # the device's own samples, held in memory through both phases
    process: int = 0  # the device process's own overhead (connection buffers, threads, slack)
    sequential: bool = True
    margin: float = 0.0  # share added to the model's bytes for what is not itemised
    upload: int = 0  # the tail's values and their encoded upload (a secure round's masked words too)

    @property
    def streaming(self) -> int:
        """Peak of the multi-step forward pass (EmbracingFL Algorithm 1), runtime excluded."""
        return self.frozen_chunk + self.tail_weights if self.frozen_chunk else 0

    @property
    def training(self) -> int:
        """Peak of training the tail, runtime excluded."""
        return self.trainable_state + self.activations + self.cached_input

    @property
    def model_bytes(self) -> int:
        """Everything but the runtime, at the peak, with the margin."""
        peak = max(self.streaming, self.training) if self.sequential else self.training + self.frozen_chunk
        peak = max(peak, self.upload)
        return math.ceil((peak + self.local_data) * (1 + self.margin))

    @property
    def total(self) -> int:
        return self.model_bytes + self.runtime + self.process

    def chunk_room(self, budget_bytes: int) -> int:
        """The largest frozen chunk (in bytes) that keeps this split within ``budget_bytes``."""
        peak = math.floor((budget_bytes - self.runtime - self.process) / (1 + self.margin)) - self.local_data
        return peak - (self.tail_weights if self.sequential else self.training)


@dataclass(frozen=True)
class ModelCost:
    """The measured cost of every block of a layered model; plain data, no torch needed.

    A split ``k`` freezes blocks [0, k) and trains blocks [k, L).
    """

    model: str
    blocks: tuple[BlockCost, ...]
    input_elements: int  # per sample, the model's input
    input_itemsize: int  # bytes per element of the model's input (8 for int64 token ids)
    sparse_blocks: tuple[str, ...] = field(default=())
    #: The sparse tables (``model.sparse_inputs``): counted in full unless a footprint is asked for
    #: a row selection.
    tables: tuple[TableCost, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def block_names(self) -> list[str]:
        return [b.name for b in self.blocks]

    def _check_split(self, k: int) -> None:
        if not 0 <= k < len(self.blocks):
            raise ValueError(f"split {k} outside [0, {len(self.blocks) - 1}] for {self.model}")

    @staticmethod
    def _check_batch(batch: int) -> None:
        if batch < 1:
            raise ValueError(f"batch size must be >= 1, not {batch}")

    # -- the paper's quantities ----------------------------------------------------------
    @property
    def adapters(self) -> bool:
        """Whether some block can be trained through LoRA adapters."""
        return any(b.adapted for b in self.blocks)

    def trainable_params(self, k: int = 0, adapters: bool = False) -> int:
        """p: trainable parameters of the suffix [k, L) (``adapters``: trained through its adapters)."""
        self._check_split(k)
        return sum(b.trained_params(adapters) for b in self.blocks[k:])

    def activations(self, k: int = 0, batch: int = 1) -> int:
        """a: activations the suffix [k, L) keeps for ``batch`` samples (the paper's rule)."""
        self._check_split(k)
        self._check_batch(batch)
        return batch * sum(b.activations for b in self.blocks[k:])

    def capacity(self, k: int, batch: int = 32, adapters: bool = False) -> float:
        """Memory of the suffix [k, L) relative to the whole model.

        EmbracingFL Section 4 ("Client Capacity Settings"): C = (2p + 2a) / (2P + 2A); trained
        through adapters, p counts what trains (the adapters), a the same activations.
        """
        p, a = self.trainable_params(k, adapters), self.activations(k, batch)
        whole_p, whole_a = self.trainable_params(0), self.activations(0, batch)
        return (2 * p + 2 * a) / (2 * whole_p + 2 * whole_a)

    # -- bytes ---------------------------------------------------------------------------
    def saved_bytes(self, k: int, batch: int, itemsize: int = 4, adapters: bool = False) -> int:
        """Bytes autograd keeps for backward when training the suffix [k, L) on one batch."""
        self._check_split(k)
        self._check_batch(batch)
        total = 0
        for b in self.blocks[k:]:
            total += (batch * b.saved(adapters) + b.saved_fixed_elements) * itemsize
            total += batch * b.saved_other_bytes
            if b.input_saved and b.index > k:
                # Kept by this block only; the tail's own input is the cached batch instead.
                total += batch * b.input_elements * itemsize
        return total

    def chunk_bytes(self, start: int, stop: int, batch: int, memory: TrainingMemory | None = None) -> int:
        """Bytes held while the frozen blocks [start, stop) run forward on one batch.

        ONNX Runtime's session cost, the chunk's weights and buffers (``frozen_copies`` of them),
        the batch coming in, the batch going out (to the activation cache) and
        the largest layer's input and output in between. No gradients, no unfolded patches
        (ONNX Runtime's convolution works through a bounded buffer). Where the chunk comes as a
        delta download, no less than its rebuild (``delta_copies`` of its weights and the delta).
        """
        memory = memory or TrainingMemory()
        if not 0 <= start < stop <= len(self.blocks):
            raise ValueError(f"block range [{start}, {stop}) outside [0, {len(self.blocks)})")
        self._check_batch(batch)
        size = memory.itemsize
        blocks = self.blocks[start:stop]
        elements = sum(b.params + b.buffers for b in blocks)
        incoming = batch * self._input_bytes(start, size)
        outgoing = batch * blocks[-1].output_elements * size
        working = batch * max(b.peak_elements for b in blocks) * size
        running = memory.session_bytes + elements * size * memory.frozen_copies + incoming + outgoing + working
        rebuild = elements * 4 * memory.delta_copies + elements * memory.delta_bits // 8  # float32 on the wire
        return max(running, rebuild)

    def _input_bytes(self, k: int, itemsize: int) -> int:
        """Bytes of one sample of block k's input."""
        if k == 0:
            return self.input_elements * self.input_itemsize
        return self.blocks[k - 1].output_elements * itemsize

    def footprint(
        self,
        k: int,
        batch: int = 32,
        *,
        memory: TrainingMemory | None = None,
        runtime_bytes: int = 0,
        chunks: Sequence[tuple[int, int]] | None = None,
        local_samples: int = 0,
        rows: Mapping[str, int] | None = None,
        adapters: bool = False,
    ) -> Footprint:
        """What a device that freezes [0, k) and trains [k, L) with ``batch`` holds.

        ``adapters``: the tail trained through its LoRA adapters: gradients, optimizer state and
        the upload's frame are the adapters' (and the parameters outside adapted layers); the
        weights under adapters are held as frozen state, and autograd keeps what it keeps then.

        ``chunks`` are the frozen block ranges streamed one at a time; without them each frozen
        block is its own chunk, the smallest peak any chunking reaches. ``local_samples`` is the
        size of the device's own dataset, which it holds in memory as model input. ``rows`` is a
        row selection (table entry -> rows the device receives): a trained table is then counted
        for those rows only, since the device builds it with just them (edge_sdk.trainer.build_tail).
        """
        memory = memory or TrainingMemory()
        self._check_split(k)
        self._check_batch(batch)
        size = memory.itemsize
        tail = self.blocks[k:]
        trainable = sum(b.trained_params(adapters) for b in tail) - self.rows_saved(k, rows)
        held = sum(b.params + b.buffers - b.trained_params(adapters) for b in tail)
        under = sum(b.trainable_params - b.trained_params(adapters) for b in tail)  # frozen under adapters: not sent
        # Backward holds the gradient flowing out of a layer and the one flowing into it, and
        # a convolution its unfolded patches: at most the largest layer's training peak.
        working = batch * max(b.train_peak_elements for b in tail) * size
        if chunks is None:
            chunks = [(i, i + 1) for i in range(k)]
        self._check_chunks(k, chunks)
        return Footprint(
            split=k,
            batch=batch,
            trainable_state=(trainable * (memory.param_copies + memory.transfer_copies)
                             + held * (1 + memory.transfer_copies)) * size,
            activations=self.saved_bytes(k, batch, size, adapters) + working,
            # Training samples every local sample's cached activations: held in memory, or paged in
            # from their file on disk as the batches reach them (resident either way by the end).
            cached_input=max(batch, local_samples if k > 0 else 0) * self._input_bytes(k, size),
            frozen_chunk=max((self.chunk_bytes(s, e, batch, memory) for s, e in chunks), default=0),
            tail_weights=(trainable + held) * size,
            runtime=runtime_bytes,
            local_data=local_samples * self.input_elements * self.input_itemsize,
            process=memory.process_bytes + memory.secure_bytes,
            sequential=memory.sequential_phases,
            margin=memory.margin,
            upload=(trainable + held + (trainable + held - under) * memory.upload_copies) * size
            + memory.codec_bytes + math.ceil((trainable + held - under) * memory.codec_bits / 8),
        )

    def rows_saved(self, k: int, rows: Mapping[str, int] | None) -> int:
        """Table elements of the trained tail [k, L) a row selection ``rows`` leaves out."""
        if not rows:
            return 0
        unknown = set(rows) - {t.entry for t in self.tables}
        if unknown:
            raise ValueError(f"rows for {sorted(unknown)}, which are not sparse tables of {self.model}")
        saved = 0
        for t in self.tables:
            if t.block >= k and t.entry in rows:
                n = rows[t.entry]
                if not 0 <= n <= t.rows:
                    raise ValueError(f"{n} rows of {t.entry!r}, a table of {t.rows} rows")
                saved += (t.rows - n) * t.row_elements
        return saved

    def _check_chunks(self, k: int, chunks: Sequence[tuple[int, int]]) -> None:
        expected = 0
        for start, stop in chunks:
            if start != expected or stop <= start:
                break
            expected = stop
        else:
            if expected == k:
                return
        raise ValueError(f"chunks {list(chunks)} must cover [0, {k}) in order, without gaps")

    # -- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelCost:
        return cls(
            model=data["model"],
            blocks=tuple(BlockCost(**b) for b in data["blocks"]),
            input_elements=data["input_elements"],
            input_itemsize=data["input_itemsize"],
            sparse_blocks=tuple(data.get("sparse_blocks", ())),
            tables=tuple(TableCost(**t) for t in data.get("tables", ())),
        )


# -- measuring ---------------------------------------------------------------------------------
@dataclass
class _Tally:
    """What one training-mode forward pass at one batch size saw, block by block."""

    batch: int
    activations: list[int]
    saved_float: list[int]  # bytes
    saved_other: list[int]  # bytes
    input_saved: list[bool]
    inputs: list[int]  # elements
    outputs: list[int]  # elements
    peaks: list[int]  # elements
    train_peaks: list[int]  # elements
    attention: list[int] = field(default_factory=list)  # elements


def _is_weight_layer(module: nn.Module) -> bool:
    """Layers whose outputs the paper counts: convolutional, dense and recurrent layers."""
    from torch import nn

    from edge_sdk.models.adapters import AdaptedLinear

    return isinstance(module, (nn.modules.conv._ConvNd, nn.Linear, nn.RNNBase, AdaptedLinear))


def _column_buffer(module: nn.Module, output: Any) -> int:
    """Elements of the unfolded-patch matrix of a convolution (im2col), per batch.

    A k x k convolution on the CPU is a matrix product over (in_channels x k x k) x (output
    positions); a 1x1, stride-1 convolution needs no such buffer. Its backward pass works on
    such buffers for both gradients. Measured on torch 2.13 (oneDNN): without them the peak of
    a ResNet20 training step at batch 128 comes out 50-80 MiB too low, and with one buffer
    instead of two, the peak of training the last stage at batch 128 about 15% too low.
    """
    from math import prod

    from torch import nn

    if not isinstance(module, nn.modules.conv._ConvNd) or module.transposed:
        return 0
    kernel, stride = prod(module.kernel_size), prod(module.stride)
    if kernel == 1 and stride == 1:
        return 0
    return output.shape[0] * module.in_channels * kernel * prod(output.shape[2:])


def _tensors(value: Any) -> Iterable[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def _tally(model: LayeredModel, batch: int) -> _Tally:
    """Run one training-mode forward over all blocks and record what each block keeps."""
    import torch

    n = len(model)
    tally = _Tally(batch, *([0] * n for _ in range(3)), [False] * n, *([0] * n for _ in range(4)))
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()  # storages already counted (by the first block that saved them)
    block_input: dict[int, int] = {}  # storage of block i's input -> i
    current = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        # Detached: a saved output packed as itself (with its grad_fn) would form a cycle through
        # autograd's C++ graph that Python's collector cannot see, leaking the measured copy.
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in state or key in seen:
            return t.detach()
        seen.add(key)
        i = current[0]
        if block_input.get(key) == i:
            # This block's own input, which the previous block did not save.
            tally.input_saved[i] = i > 0
        elif t.is_floating_point():
            tally.saved_float[i] += storage.nbytes()
        else:
            tally.saved_other[i] += storage.nbytes()
        return t.detach()

    def leaf_hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        i = current[0]
        outs = list(_tensors(output))
        size = sum(t.numel() for t in _tensors(args)) + sum(t.numel() for t in outs)
        tally.peaks[i] = max(tally.peaks[i], size)
        # Backward unfolds patches twice: for the input's gradient and for the weight's.
        columns = _column_buffer(module, outs[0]) if outs else 0
        tally.train_peaks[i] = max(tally.train_peaks[i], size + 2 * columns)
        if _is_weight_layer(module):
            # A recurrent layer's first output is its sequence; (h_n, c_n) are its last step.
            tally.activations[i] += outs[0].numel()

    def attention(out: torch.Tensor) -> None:
        i = current[0]
        tally.attention[i] += out.numel()
        tally.activations[i] += out.numel()
        tally.peaks[i] = max(tally.peaks[i], 2 * out.numel())  # the scores and the weights
        tally.train_peaks[i] = max(tally.train_peaks[i], 3 * out.numel())  # weights and two gradients

    tally.attention = [0] * n
    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(leaf_hook) for m in leaves]
    x = model.sample_input(batch, generator=torch.Generator().manual_seed(0))
    try:
        with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                _AttentionWatch(attention):
            torch.manual_seed(0)
            for i in range(n):
                current[0] = i
                block_input[x.untyped_storage().data_ptr()] = i
                tally.inputs[i] = x.numel()
                x = model.block(i)(x)
                tally.outputs[i] = x.numel()
    finally:
        for h in handles:
            h.remove()
    return tally


def _AttentionWatch(seen: Any) -> Any:
    """A torch function mode that calls ``seen(weights)`` for every softmax over the last axis of a
    square matrix (..., T, T): an attention layer's weights, however the model spells it."""
    import torch
    from torch.overrides import TorchFunctionMode

    softmaxes = (torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax, torch.nn.functional.log_softmax)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in softmaxes and isinstance(out, torch.Tensor) and out.dim() >= 3 and \
                    out.shape[-1] == out.shape[-2] and _last_axis(out.dim(), args, kwargs or {}):
                seen(out)
            return out

    return Watch()


def _last_axis(ndim: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim is not None and int(dim) % ndim == ndim - 1


def _split(small: int, large: int, b_small: int, b_large: int) -> tuple[int, int]:
    """A size measured at two batch sizes as (per sample, batch-independent), rounded up."""
    per = -(-(large - small) // (b_large - b_small))
    return per, max(0, small - per * b_small)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _adapted_tallies(work: LayeredModel, frozen: set[str]) -> tuple[_Tally, _Tally] | None:
    """The two tallies again with the weights under adapters frozen (None: the model has no adapters)."""
    if not frozen:
        return None
    params = [p for n, p in work.named_parameters() if n in frozen]
    for p in params:
        p.requires_grad_(False)
    try:
        small, large = (_tally(work, b) for b in _MEASURE_BATCHES)
    finally:
        for p in params:
            p.requires_grad_(True)
    return small, large


def _adapter_fields(block: nn.Module, prefix: str, frozen: set[str], adapted: tuple[_Tally, _Tally] | None,
                    i: int, float_size: int) -> dict[str, Any]:
    """A block's :class:`BlockCost` fields for training through its adapters."""
    under = sum(p.numel() for n, p in block.named_parameters() if prefix + n in frozen)
    if adapted is None or not under:
        return {}
    small, large = adapted
    per, _ = _split(small.saved_float[i], large.saved_float[i], small.batch, large.batch)
    trainable = sum(p.numel() for p in block.parameters() if p.requires_grad)
    return {"adapted": True, "adapter_params": trainable - under, "adapter_saved_elements": _ceil_div(per, float_size)}


def measure_model(model: LayeredModel) -> ModelCost:
    """Measure every block of ``model`` by running it.

    Two training-mode forward passes at batches of 2 and 4, on a copy (the model's BatchNorm
    statistics and random state stay as they were); well under a second for the zoo's models.
    """
    import torch

    from edge_sdk.models.adapters import adapter_frozen

    float_size = torch.empty((), dtype=torch.float32).element_size()
    work = copy.deepcopy(model).train()
    small, large = (_tally(work, b) for b in _MEASURE_BATCHES)
    b1, b2 = small.batch, large.batch
    frozen = set(adapter_frozen(work))
    adapted = _adapted_tallies(work, frozen)
    blocks = []
    for i, name in enumerate(model.block_names):
        block = model.block(i)
        saved_per, saved_fixed = _split(small.saved_float[i], large.saved_float[i], b1, b2)
        other_per, _ = _split(small.saved_other[i], large.saved_other[i], b1, b2)
        blocks.append(
            BlockCost(
                index=i,
                name=name,
                trainable_params=sum(p.numel() for p in block.parameters() if p.requires_grad),
                frozen_params=sum(p.numel() for p in block.parameters() if not p.requires_grad),
                buffers=sum(b.numel() for b in block.buffers()),
                activations=large.activations[i] // b2,
                saved_elements=_ceil_div(saved_per, float_size),
                saved_fixed_elements=_ceil_div(saved_fixed, float_size),
                saved_other_bytes=other_per,
                input_saved=large.input_saved[i],
                input_elements=large.inputs[i] // b2,
                output_elements=large.outputs[i] // b2,
                peak_elements=_ceil_div(large.peaks[i], b2),
                train_peak_elements=_ceil_div(large.train_peaks[i], b2),
                sparse=name in model.sparse_blocks,
                attention_elements=large.attention[i] // b2,
                **_adapter_fields(block, f"blocks.{name}.", frozen, adapted, i, float_size),
            )
        )
    sample = model.sample_input(1, generator=torch.Generator().manual_seed(0))
    state = model.state_dict()
    owner = {f"blocks.{name}.": i for i, name in enumerate(model.block_names)}
    tables = tuple(
        TableCost(entry=entry, block=next(i for prefix, i in owner.items() if entry.startswith(prefix)),
                  rows=int(state[entry].shape[0]), row_elements=int(state[entry][0].numel()))
        for entry in sorted(getattr(model, "sparse_inputs", {}))
    )
    return ModelCost(
        model=model.name,
        blocks=tuple(blocks),
        input_elements=sample.numel(),
        input_itemsize=sample.element_size(),
        sparse_blocks=tuple(sorted(model.sparse_blocks)),
        tables=tables,
    )
