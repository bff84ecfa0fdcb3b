"""The messages of the wire protocol, as plain dataclasses.

Each class is one message type (docs/protocol.md, "Messages"); its ``TYPE`` is the ``"t"`` field on
the wire and its fields, in order, are the remaining keys. Instances are immutable: build a new one
with :func:`dataclasses.replace`. Constructors normalise harmless spellings (a ``tuple`` for a
``list``, an ``int`` for a ``float``, numpy scalars and str enums for plain values) so that
``decode(encode(m)) == m``; everything else is checked by :func:`~edge_sdk.protocol.encode` and
:func:`~edge_sdk.protocol.decode`, which raise :class:`~edge_sdk.protocol.ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Union

import numpy as np

from .errors import ErrorCode, ProtocolError

__all__ = [
    "PROTOCOL_VERSION",
    "PROBE_STEP_MAX_S",
    "Scalar",
    "Message",
    "Hello",
    "Welcome",
    "Instruction",
    "Fetch",
    "TransferBegin",
    "TransferFrame",
    "TransferEnd",
    "Report",
    "Ack",
    "Error",
    "Bye",
    "Resume",
    "SecAggKeys",
    "SecAggPeers",
    "SecAggShares",
    "SecAggInbox",
    "SecAggUnmask",
    "SecAggReveal",
    "SECAGG_MESSAGES",
    "SECAGG_KEY",
    "MESSAGE_TYPES",
    "PHASES",
    "TENSOR_PHASES",
    "SELECTIONS",
    "PAYLOAD_KINDS",
    "TRAIN_GRAPH_KEY",
    "EXT_MAX_KEYS",
    "EXT_MAX_KEY_CHARS",
    "EXT_MAX_BYTES",
    "EXT_MAX_DEPTH",
    "EXT_KEY",
]

#: Version of the wire format; every message carries it in ``"v"``. Bump it on any incompatible change.
PROTOCOL_VERSION = 4

#: Values allowed in ``config``, ``meta`` and ``metrics`` maps.
Scalar = Union[str, int, float, bool]

#: Phases a device of this SDK knows (docs/protocol.md, "Phases"). ``train``: train the selected state
#: and report its deltas; ``evaluate``: report the loss of the received model on the local data;
#: ``compare``: report the squared distance between this round's update and a broadcast update.
PHASES = frozenset({"train", "evaluate", "compare"})
#: The phases whose report carries tensors (an ``update`` transfer: deltas of the state the selection
#: sent); the others report metrics only.
TENSOR_PHASES = frozenset({"train"})

#: How the state a device receives is cut from the global state (docs/protocol.md, "Selections"):
#: the whole tail ``[split, L)``; the tail with sparse tables cut to rows; the tail cut to channels.
SELECTIONS = frozenset({"tail", "rows", "channels", "adapters"})

#: ``TransferBegin.kind`` values: payloads the server streams, and the device's update.
#: ``train_graph``: a tail's training step as ONNX (edge_sdk.ort_trainer), named by an
#: instruction's ``config["train_graph_id"]``.
PAYLOAD_KINDS = frozenset({"chunk", "model", "broadcast", "train_graph", "update"})

#: The instruction ``config`` key that names a training-graph payload (docs/protocol.md, "Phases").
TRAIN_GRAPH_KEY = "train_graph_id"

#: Bounds of ``Hello.ext`` (docs/protocol.md, "Extension fields"): keys, characters per key, encoded
#: size of all values together (approximately msgpack's), and nesting of lists and maps.
EXT_MAX_KEYS, EXT_MAX_KEY_CHARS, EXT_MAX_BYTES, EXT_MAX_DEPTH = 32, 64, 1 << 20, 4

#: An extension key: ``namespace.name``, lower-case letters, digits, ``_`` and ``-`` (more dots may follow).
EXT_KEY = re.compile(r"[a-z0-9_-]+\.[a-z0-9_.-]+")

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


#: The longest probe step a hello may claim (seconds): the probe takes microseconds to milliseconds on
#: a device that can train at all, so more is not a measurement.
PROBE_STEP_MAX_S = 60.0


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ProtocolError(ErrorCode.MALFORMED, message)


@dataclass(frozen=True)
class Message:
    """Base of every message. ``TYPE`` is the wire name (the ``"t"`` field)."""

    TYPE: ClassVar[str] = ""
    #: Fields a peer may leave out (their defaults apply): added to a message without a version
    #: bump, so devices that predate them keep working. Left out on the wire when at their default.
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        for name, kind in _SCHEMAS.get(type(self), ()):
            value = getattr(self, name)
            fixed = _normalise(kind, value)
            if fixed is not value:
                object.__setattr__(self, name, fixed)

    def check(self) -> None:
        """Check the value constraints that types alone cannot express (raises ``malformed``)."""


@dataclass(frozen=True)
class Hello(Message):
    """Device -> server, the first message of a connection: who the device is and what it can hold."""

    TYPE: ClassVar[str] = "hello"

    device_id: str
    token: str
    budget_bytes: int
    cores: int
    runtimes: list[str]
    num_samples: int
    device_class: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    #: The round the device was in when it lost its connection, or -1 for a fresh start.
    resume_round: int = -1
    #: For integer inputs that index embedding tables: per input column (``"0"``, ``"1"``...), the
    #: sorted distinct values the local data holds (the rows of its submodel, FedSubAvg).
    rows: dict[str, list[int]] = field(default_factory=dict)
    #: Extension fields a strategy declares (``namespace.name`` -> msgpack value: scalar, bytes,
    #: list or map), e.g. FedSubAvg's private row heat; bounded by the ``EXT_*`` constants.
    ext: dict[str, object] = field(default_factory=dict)
    #: Optional: one local sample's shape (without the batch axis); empty: not declared. The server
    #: refuses, before sending any of the model, a device whose samples the model cannot take.
    input_shape: list[int] = field(default_factory=list)
    #: Optional: the label count of the local data (largest label + 1); -1: not declared (or a
    #: regression target). Refused when the model has fewer classes.
    num_classes: int = -1
    #: Optional: the seconds one local training step of the SDK's probe (a fixed tiny dense layer on a
    #: probe batch, :data:`PROBE_STEP_MAX_S` at most) took on this device with its training backend;
    #: 0: not measured. The server seeds the device's pace with it before its first round is timed
    #: (orchestrator/server/pace.py).
    probe_step_s: float = 0.0

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"input_shape", "num_classes", "probe_step_s"})

    def check(self) -> None:
        _require(self.device_id != "", "hello.device_id is empty")
        _require(len(self.input_shape) <= 8 and all(d >= 1 for d in self.input_shape),
                 "hello.input_shape has more than 8 axes or an axis below 1")
        _require(self.num_classes >= -1, "hello.num_classes is below -1")
        _require(0.0 <= self.probe_step_s <= PROBE_STEP_MAX_S,
                 f"hello.probe_step_s is outside [0, {PROBE_STEP_MAX_S:g}] seconds")
        for column, values in self.rows.items():
            _require(all(b > a for a, b in zip(values, values[1:])), f"hello.rows[{column!r}] is not strictly increasing")
            _require(not values or values[0] >= 0, f"hello.rows[{column!r}] holds a negative row")
        _require(self.budget_bytes >= 0, "hello.budget_bytes is negative")
        _require(self.cores >= 0, "hello.cores is negative")
        _require(self.num_samples >= 0, "hello.num_samples is negative")
        _require(self.resume_round >= -1, "hello.resume_round is below -1")


@dataclass(frozen=True)
class Welcome(Message):
    """Server -> device, the answer to ``Hello``: the device's role and split, and the frozen chunks.

    ``chunks`` lists the block ranges ``(start, stop)`` into which the frozen blocks ``[0, split)``
    are cut; the device fetches them in this order.
    """

    TYPE: ClassVar[str] = "welcome"

    device_id: str
    role: str
    split: int
    num_blocks: int
    chunks: list[tuple[int, int]]
    model: str
    model_version: int
    batch_size: int
    local_steps: int
    config: dict[str, Scalar]

    def check(self) -> None:
        _require(self.num_blocks >= 0, "welcome.num_blocks is negative")
        _require(0 <= self.split <= self.num_blocks, "welcome.split is outside [0, num_blocks]")
        for start, stop in self.chunks:
            _require(0 <= start < stop <= self.num_blocks, f"welcome.chunks has a bad range ({start}, {stop})")
        _require(self.model_version >= 0, "welcome.model_version is negative")
        _require(self.batch_size >= 1, "welcome.batch_size is below 1")
        _require(self.local_steps >= 0, "welcome.local_steps is negative")


@dataclass(frozen=True)
class Instruction(Message):
    """Server -> device: do ``phase`` in ``round``. A device may get several in one round (a
    strategy's follow-ups); each is answered by one ``Report``.

    The device fetches ``chunk_ids`` in order and runs them forward (blocks ``[0, split)``), then
    ``model_id``: the state of blocks ``[split, L)`` cut by ``selection``. ``broadcast_id`` names
    tensors the strategy sends along (for example the mean update of other devices), or is ``""``.
    """

    TYPE: ClassVar[str] = "instruction"

    round: int
    phase: str
    model_version: int
    split: int
    chunk_ids: list[str]
    model_id: str
    selection: str
    broadcast_id: str
    local_steps: int
    lr: float
    deadline_s: float
    config: dict[str, Scalar]
    #: Optional: payload id -> sha256 of each payload the instruction names. A device that holds a
    #: payload of that content (from an earlier round or connection) fetches it with ``Fetch.held``
    #: and is sent no byte of it (docs/protocol.md, "Held payloads").
    digests: dict[str, str] = field(default_factory=dict)

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"digests"})

    def check(self) -> None:
        _require(self.round >= 0, "instruction.round is negative")
        _require(all(_SHA256_HEX.fullmatch(d) is not None for d in self.digests.values()),
                 "instruction.digests holds a value that is not 64 lowercase hex digits")
        _require(self.phase != "", "instruction.phase is empty")
        _require(self.model_version >= 0, "instruction.model_version is negative")
        _require(self.split >= 0, "instruction.split is negative")
        _require(self.model_id != "", "instruction.model_id is empty")
        _require(all(self.chunk_ids), "instruction.chunk_ids holds an empty id")
        _require(self.selection in SELECTIONS,
                 f"instruction.selection {self.selection!r} is not one of {sorted(SELECTIONS)}")
        _require(self.local_steps >= 0, "instruction.local_steps is negative")
        _require(self.lr >= 0.0, "instruction.lr is negative")
        _require(self.deadline_s >= 0.0, "instruction.deadline_s is negative")


@dataclass(frozen=True)
class Fetch(Message):
    """Device -> server: send me payload ``payload_id`` (a chunk, model or broadcast id of the
    device's current instruction), starting at byte ``offset`` (non-zero when resuming)."""

    TYPE: ClassVar[str] = "fetch"

    round: int
    payload_id: str
    offset: int = 0
    #: Optional: the sha256 of the payload's bytes the device already holds (``Instruction.digests``),
    #: or ``""``. When it is the server's, the server answers with a ``TransferBegin`` at
    #: ``offset == total_size`` and no frame; otherwise it sends the whole payload from 0.
    held: str = ""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"held"})

    def check(self) -> None:
        _require(self.round >= 0, "fetch.round is negative")
        _require(self.held == "" or _SHA256_HEX.fullmatch(self.held) is not None,
                 "fetch.held is neither empty nor 64 lowercase hex digits")
        _require(self.payload_id != "", "fetch.payload_id is empty")
        _require(self.offset >= 0, "fetch.offset is negative")


@dataclass(frozen=True)
class TransferBegin(Message):
    """Either way: a payload of ``total_size`` bytes follows in ``TransferFrame`` messages, starting at
    ``offset`` (0, or the receiver's held bytes when resuming), each at most ``frame_size`` bytes.

    ``sha256`` is the digest of the whole payload, known before the first frame (a payload sent many
    times), or ``""``: the sender hashes as it streams and a ``TransferEnd`` follows the last frame.
    """

    TYPE: ClassVar[str] = "transfer_begin"

    transfer_id: str
    kind: str
    total_size: int
    sha256: str
    frame_size: int
    offset: int
    meta: dict[str, Scalar]

    def check(self) -> None:
        _require(self.transfer_id != "", "transfer_begin.transfer_id is empty")
        _require(self.kind != "", "transfer_begin.kind is empty")
        _require(self.total_size >= 0, "transfer_begin.total_size is negative")
        _require(self.sha256 == "" or _SHA256_HEX.fullmatch(self.sha256) is not None,
                 "transfer_begin.sha256 is neither empty nor 64 lowercase hex digits")
        _require(self.frame_size >= 1, "transfer_begin.frame_size is below 1")
        _require(0 <= self.offset <= self.total_size, "transfer_begin.offset is outside [0, total_size]")


@dataclass(frozen=True)
class TransferFrame(Message):
    """Either way: ``data`` holds payload bytes ``[offset, offset + len(data))`` of a transfer.

    ``data`` may be any bytes-like object; decoded frames hold a read-only ``memoryview`` into the
    received websocket message (no copy).
    """

    TYPE: ClassVar[str] = "transfer_frame"

    transfer_id: str
    offset: int
    data: bytes

    def check(self) -> None:
        _require(self.transfer_id != "", "transfer_frame.transfer_id is empty")
        _require(self.offset >= 0, "transfer_frame.offset is negative")
        _require(len(self.data) > 0, "transfer_frame.data is empty")


@dataclass(frozen=True)
class TransferEnd(Message):
    """Either way: the sha256 of the whole payload, right after the last frame of a transfer whose
    ``TransferBegin.sha256`` was empty (and only then)."""

    TYPE: ClassVar[str] = "transfer_end"

    transfer_id: str
    sha256: str

    def check(self) -> None:
        _require(self.transfer_id != "", "transfer_end.transfer_id is empty")
        _require(_SHA256_HEX.fullmatch(self.sha256) is not None, "transfer_end.sha256 is not 64 lowercase hex digits")


@dataclass(frozen=True)
class Report(Message):
    """Device -> server: the outcome of one instruction. ``metrics`` holds what the phase measured
    (``loss_before``/``loss_after`` for training, ``loss`` for evaluation, ...). When the phase has
    tensors (a training's deltas), ``transfer_id`` is non-empty and a transfer of kind ``"update"``
    with that id follows (``encode_tensors``; row-sparse entries allowed). ``trained`` is the block
    range ``[start, stop)`` the tensors cover (``(0, 0)`` when there are none)."""

    TYPE: ClassVar[str] = "report"

    round: int
    phase: str
    num_samples: int
    trained: tuple[int, int]
    transfer_id: str
    metrics: dict[str, Scalar]
    #: Optional: the ``Instruction.model_version`` this report answers, echoed (``-1``: not said, a
    #: device that predates the field). Buffered rounds weigh an update by its staleness, the
    #: versions the model moved on since (docs/protocol.md, "Model versions").
    model_version: int = -1

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"model_version"})

    def check(self) -> None:
        _require(self.round >= 0, "report.round is negative")
        _require(self.model_version >= -1, "report.model_version is below -1")
        _require(self.phase != "", "report.phase is empty")
        _require(self.num_samples >= 0, "report.num_samples is negative")
        start, stop = self.trained
        _require(0 <= start <= stop, f"report.trained has a bad range ({start}, {stop})")
        _require(self.transfer_id != "" or (start, stop) == (0, 0),
                 "report.trained must be (0, 0) when the report has no tensors")


@dataclass(frozen=True)
class Ack(Message):
    """Server -> device after a report: whether the strategy took it, and if not why."""

    TYPE: ClassVar[str] = "ack"

    round: int
    accepted: bool
    reason: str = ""
    phase: str = ""

    def check(self) -> None:
        _require(self.round >= 0, "ack.round is negative")


@dataclass(frozen=True)
class Error(Message):
    """Either way, just before the sender closes the connection. ``code`` is an :class:`ErrorCode` value."""

    TYPE: ClassVar[str] = "error"

    code: str
    message: str

    def check(self) -> None:
        _require(self.code != "", "error.code is empty")


@dataclass(frozen=True)
class Bye(Message):
    """Either way: an orderly goodbye (server stopping, training finished)."""

    TYPE: ClassVar[str] = "bye"

    reason: str = ""


@dataclass(frozen=True)
class Resume(Message):
    """Receiver -> sender after a reconnect: continue transfer ``transfer_id`` from byte ``offset``."""

    TYPE: ClassVar[str] = "resume"

    transfer_id: str
    offset: int

    def check(self) -> None:
        _require(self.transfer_id != "", "resume.transfer_id is empty")
        _require(self.offset >= 0, "resume.offset is negative")


# --- secure aggregation (docs/protocol.md, "Secure aggregation") --------------------------------------
# Sizes of edge_sdk.secagg's values, repeated here so that the protocol needs no cryptography import
# (tests/test_secagg_round.py checks that they agree).

#: The instruction ``config`` key that makes a train instruction a secure one: the round's scope
#: (``Scope.session``); ``secagg_clip`` (float) is the L2 bound the device clips each block to.
SECAGG_KEY = "secagg_session"
_KEY_BYTES, _SIGNATURE_BYTES, _SEALED_BYTES, _SHARE_BYTES, _MAX_PEERS = 32, 64, 94, 33, 255
_MAX_SECURE_BLOCKS = 255  # blocks a device of a secure round trains: one seed (and share) each


def _multiple(name: str, values: Mapping[str, bytes], base: int, step: int = _SHARE_BYTES) -> None:
    """Each value is ``base`` + ``step`` m bytes for 0 <= m <= 255 (one per block a device trained)."""
    _require(len(values) <= _MAX_PEERS, f"{name} names {len(values)} devices, more than {_MAX_PEERS}")
    _ids(name, values)
    for key, value in values.items():
        extra = len(value) - base
        _require(0 <= extra <= step * _MAX_SECURE_BLOCKS and extra % step == 0,
                 f"{name}[{key[:40]!r}] is {len(value)} bytes, not {base} + {step} m")


def _ids(name: str, ids: object) -> None:
    _require(all(isinstance(i, str) and i != "" for i in ids), f"{name} holds an empty device id")


def _sized(name: str, values: Mapping[str, bytes], size: int, most: int = _MAX_PEERS) -> None:
    _require(len(values) <= most, f"{name} names {len(values)} devices, more than {most}")
    _ids(name, values)
    for key, value in values.items():
        _require(len(value) == size, f"{name}[{key[:40]!r}] is {len(value)} bytes, not {size}")


@dataclass(frozen=True)
class SecAggKeys(Message):
    """Device -> server, SecAgg+ round 0 (AdvertiseKeys; Bell et al. 2020, Algorithm 2, Round 1 of
    Bonawitz et al. 2017): the device's two fresh X25519 public keys for the round, ``cipher_public``
    (c_u^PK: share encryption) and ``mask_public`` (s_u^PK: pairwise masks), with the Ed25519
    ``signature`` of its identity key on them, on its split (the first block it trained) and on
    ``commitments``, 32 bytes per trained block committing to that block's self-mask seed
    (edge_sdk.secagg.binding). Sent after training, in
    the state ``WORKING`` of a train instruction whose config names ``secagg_session``; answered
    by ``SecAggPeers``, or by ``Ack(accepted=false)`` (the device is not in the round's cohort).
    ``commitments`` is optional to the codec (an older device's advertisement decodes); a secure
    round refuses an advertisement without them."""

    TYPE: ClassVar[str] = "secagg_keys"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"commitments"})

    round: int
    cipher_public: bytes
    mask_public: bytes
    signature: bytes
    commitments: bytes = b""

    def check(self) -> None:
        _require(self.round >= 0, "secagg_keys.round is negative")
        _require(len(self.cipher_public) == _KEY_BYTES, "secagg_keys.cipher_public is not 32 bytes")
        _require(len(self.mask_public) == _KEY_BYTES, "secagg_keys.mask_public is not 32 bytes")
        _require(len(self.signature) == _SIGNATURE_BYTES, "secagg_keys.signature is not 64 bytes")
        _require(len(self.commitments) % _KEY_BYTES == 0 and len(self.commitments) <= _KEY_BYTES * _MAX_SECURE_BLOCKS,
                 "secagg_keys.commitments is not 32 bytes per block")


@dataclass(frozen=True)
class SecAggPeers(Message):
    """Server -> device: the round's key cohort and the device's neighbours' advertisements.

    ``members``: every device that advertised keys, sorted (the device rebuilds the neighbour graph
    from ``graph_seed``, edge_sdk.secagg.graph, with ``degree``); per neighbour its keys, signature,
    ``identities`` (Ed25519 public keys of the roster) and ``splits`` (the first block it trained:
    the block cohorts). The fixed point: ``clip`` C, ``frac_bits`` f, ``ring_bits`` b, ``cohort`` n
    (edge_sdk.secagg.fixedpoint); ``weight_scale``: a device's aggregation weight is
    ``min(1, num_samples / weight_scale)``; ``threshold`` t of a device's deg + 1 shares rebuild its secrets.
    Distributed DP (optional, absent without it): ``noise_sigma`` maps a block (its index as a string)
    to sigma_b, the standard deviation in ring units the noise of its sum must reach, and
    ``noise_survivors`` to n_min_b: the device adds N_Z(0, sigma_b^2 / n_min_b) to each value word.
    ``commitments``: per neighbour, its signed seed commitments (part of what its signature covers);
    ``min_survivors``: the round's t, the fewest devices whose sum of a block is ever revealed (a device
    refuses a round whose t is below its own setting). A compressed round (optional, absent without
    it): ``value_bits`` q and ``value_spread`` k (edge_sdk.secagg.fixedpoint.Compression); each block's
    fixed point follows from them, and ``ring_bits`` is b = bit_length(cohort (2^(q-1) - 1)) + 1.
    ``weight``: this device's aggregation weight in [0, 1], fixed by the server from its registered
    samples (the device multiplies its update by it; -1, absent: a server that predates it, and the
    device takes ``min(1, num_samples / weight_scale)``)."""

    TYPE: ClassVar[str] = "secagg_peers"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"noise_sigma", "noise_survivors", "commitments", "min_survivors",
                                                    "value_bits", "value_spread", "weight"})

    round: int
    graph_seed: bytes
    degree: int
    members: list[str]
    cipher_keys: dict[str, bytes]
    mask_keys: dict[str, bytes]
    signatures: dict[str, bytes]
    identities: dict[str, bytes]
    splits: dict[str, Scalar]
    clip: float
    frac_bits: int
    ring_bits: int
    cohort: int
    weight_scale: float
    threshold: int
    noise_sigma: dict[str, Scalar] = field(default_factory=dict)
    noise_survivors: dict[str, Scalar] = field(default_factory=dict)
    commitments: dict[str, bytes] = field(default_factory=dict)
    min_survivors: int = 0
    value_bits: int = 0
    value_spread: float = 0.0
    weight: float = -1.0

    def check(self) -> None:
        _require(self.round >= 0, "secagg_peers.round is negative")
        _require(0 <= self.value_bits <= 24 and math.isfinite(self.value_spread) and self.value_spread >= 0
                 and (self.value_bits == 0) == (self.value_spread == 0) and self.value_bits != 1,
                 "secagg_peers.value_bits and value_spread are not a compression (q in [2, 24], k > 0) or none")
        _require(self.weight == -1.0 or 0.0 <= self.weight <= 1.0, "secagg_peers.weight is outside [0, 1]")
        _multiple("secagg_peers.commitments", self.commitments, 0, _KEY_BYTES)
        _require(0 <= self.min_survivors <= _MAX_PEERS, "secagg_peers.min_survivors is outside [0, 255]")
        _require(len(self.graph_seed) == _KEY_BYTES, "secagg_peers.graph_seed is not 32 bytes")
        _ids("secagg_peers.members", self.members)
        _require(len(set(self.members)) == len(self.members), "secagg_peers.members repeats a device")
        for name, size in (("cipher_keys", _KEY_BYTES), ("mask_keys", _KEY_BYTES),
                           ("signatures", _SIGNATURE_BYTES), ("identities", _KEY_BYTES)):
            _sized(f"secagg_peers.{name}", getattr(self, name), size)
        _require(all(type(v) is int and v >= 0 for v in self.splits.values()), "secagg_peers.splits holds a non-index")
        _require(self.clip > 0.0, "secagg_peers.clip is not positive")
        _require(1 <= self.degree <= _MAX_PEERS - 1, "secagg_peers.degree is outside [1, 254]")
        _require(0 <= self.frac_bits <= 60 and 1 <= self.ring_bits <= 32, "secagg_peers has a bad fixed point")
        _require(self.cohort >= 2 and self.threshold >= 2, "secagg_peers.cohort or threshold is below 2")
        _require(self.weight_scale > 0.0, "secagg_peers.weight_scale is not positive")
        _require(set(self.noise_sigma) == set(self.noise_survivors), "secagg_peers.noise_* name different blocks")
        _require(all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in self.noise_sigma.values()),
                 "secagg_peers.noise_sigma holds a value that is not a finite number >= 0")
        _require(all(type(v) is int and v >= 1 for v in self.noise_survivors.values()),
                 "secagg_peers.noise_survivors holds a count below 1")


@dataclass(frozen=True)
class SecAggShares(Message):
    """Device -> server, SecAgg+ round 1 (ShareKeys): per neighbour, its Shamir shares of the
    device's self-mask seed b_u and mask private key s_u^SK, sealed for that neighbour alone
    (edge_sdk.secagg.sealing: 28 + 33 (m + 1) bytes each for a device that trained m blocks, one
    seed per block). The server routes them unopened."""

    TYPE: ClassVar[str] = "secagg_shares"

    round: int
    sealed: dict[str, bytes]

    def check(self) -> None:
        _require(self.round >= 0, f"{self.TYPE}.round is negative")
        _multiple(f"{self.TYPE}.sealed", self.sealed, _SEALED_BYTES)


@dataclass(frozen=True)
class SecAggInbox(SecAggShares):
    """Server -> device: the sealed shares its neighbours sent it (sender id -> 28 + 33 (m + 1) bytes). The
    device then masks its update (SecAgg+ round 2, MaskedInputCollection) and reports it."""

    TYPE: ClassVar[str] = "secagg_inbox"


@dataclass(frozen=True)
class SecAggUnmask(Message):
    """Server -> device, SecAgg+ round 3 (Unmasking), after the masked uploads: of the device's
    neighbours that sent it shares, ``survivors`` uploaded a masked update and ``dropped`` did not;
    ``blocks``: the blocks the server unmasks (each one's surviving cohort reaches the round's t),
    whose seeds alone the device reveals. Sent while the device is idle, after its report's ``Ack``,
    twice (the consistency round, Bonawitz et al. 2017, ConsistencyCheck): first with
    ``survivor_set`` (every device whose masked upload the server summed) and no ``signatures``, which
    the device answers with its signature on that set (``SecAggReveal.consent``); then with the same
    set and ``signatures`` (signer -> its Ed25519 signature on it, for the signers among the device's
    neighbours and itself), which the device checks before it answers with its shares."""

    TYPE: ClassVar[str] = "secagg_unmask"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"blocks", "survivor_set", "signatures"})

    round: int
    survivors: list[str]
    dropped: list[str]
    blocks: list[int] = field(default_factory=list)
    survivor_set: list[str] = field(default_factory=list)
    signatures: dict[str, bytes] = field(default_factory=dict)

    def check(self) -> None:
        _ids("secagg_unmask.survivor_set", self.survivor_set)
        _require(len(self.survivor_set) <= 1 << 16 and len(set(self.survivor_set)) == len(self.survivor_set),
                 "secagg_unmask.survivor_set repeats a device")
        _sized("secagg_unmask.signatures", self.signatures, _SIGNATURE_BYTES)
        _require(len(self.blocks) <= 1 << 16 and all(type(b) is int and b >= 0 for b in self.blocks)
                 and len(set(self.blocks)) == len(self.blocks), "secagg_unmask.blocks is not a set of block indices")
        _require(self.round >= 0, "secagg_unmask.round is negative")
        _ids("secagg_unmask.survivors", self.survivors)
        _ids("secagg_unmask.dropped", self.dropped)
        _require(not set(self.survivors) & set(self.dropped), "secagg_unmask names a device as survivor and dropped")


@dataclass(frozen=True)
class SecAggReveal(Message):
    """Device -> server, the answer to ``SecAggUnmask``: its shares of each survivor's self-mask
    seeds of the blocks asked that the survivor trained (``seed_shares``, 33 bytes per block in
    block order) and of each dropped device's mask private key (``key_shares``, 33 bytes); never
    both for one device (Bonawitz et al. 2017, Round 4: that would reveal its update). A peer whose
    sealed shares did not open for the device is left out of both. The answer to the consistency
    round's first request is ``consent`` alone: the device's signature on the survivor set, no shares."""

    TYPE: ClassVar[str] = "secagg_reveal"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"consent"})

    round: int
    seed_shares: dict[str, bytes]
    key_shares: dict[str, bytes]
    consent: bytes = b""

    def check(self) -> None:
        _require(len(self.consent) in (0, _SIGNATURE_BYTES), "secagg_reveal.consent is not a 64-byte signature")
        _require(not self.consent or not (self.seed_shares or self.key_shares),
                 "secagg_reveal gives shares with its consent")
        _require(self.round >= 0, "secagg_reveal.round is negative")
        _multiple("secagg_reveal.seed_shares", self.seed_shares, _SHARE_BYTES)
        _sized("secagg_reveal.key_shares", self.key_shares, _SHARE_BYTES)
        _require(not set(self.seed_shares) & set(self.key_shares),
                 "secagg_reveal gives both shares of one device")


#: The secure aggregation messages, either way.
SECAGG_MESSAGES = (SecAggKeys, SecAggPeers, SecAggShares, SecAggInbox, SecAggUnmask, SecAggReveal)


# --- field kinds -------------------------------------------------------------------------------------
# Each annotation maps to one kind; the codec validates decoded values by kind.

STR, INT, FLOAT, BOOL, BYTES = "str", "int", "float", "bool", "bytes"
LIST_STR, PAIR, LIST_PAIR, DICT_STR, DICT_SCALAR = "list[str]", "pair", "list[pair]", "dict[str]", "dict[scalar]"
DICT_INTS = "dict[list[int]]"
LIST_INT = "list[int]"
DICT_BYTES = "dict[bytes]"
EXT = "ext"

_KINDS: dict[object, str] = {
    str: STR,
    int: INT,
    float: FLOAT,
    bool: BOOL,
    bytes: BYTES,
    list[str]: LIST_STR,
    list[int]: LIST_INT,
    tuple[int, int]: PAIR,
    list[tuple[int, int]]: LIST_PAIR,
    dict[str, str]: DICT_STR,
    dict[str, Scalar]: DICT_SCALAR,
    dict[str, list[int]]: DICT_INTS,
    dict[str, bytes]: DICT_BYTES,
    dict[str, object]: EXT,
}


def _plain(value: object) -> object:
    """numpy scalars and str/int enums as the plain Python values msgpack writes."""
    if type(value) in (str, int, float, bool) or isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _normalise(kind: str, value: object) -> object:
    """Accept equivalent spellings so that equality survives a round trip; never hides a type error."""
    if kind in (STR, INT, BOOL):
        return _plain(value)
    if kind == FLOAT:
        value = _plain(value)
        if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
            return float(value)
    elif kind == PAIR:
        if isinstance(value, (list, tuple)):
            return tuple(_plain(v) for v in value)
    elif kind == LIST_PAIR:
        if isinstance(value, (list, tuple)):
            return [tuple(_plain(v) for v in p) if isinstance(p, (list, tuple)) else p for p in value]
    elif kind in (LIST_STR, LIST_INT):
        if isinstance(value, (list, tuple)):
            return [_plain(v) for v in value]
    elif kind in (DICT_STR, DICT_SCALAR):
        if isinstance(value, Mapping):
            return {_plain(k): _plain(v) for k, v in value.items()}
    elif kind == DICT_BYTES:
        if isinstance(value, Mapping):
            return {_plain(k): bytes(v) if isinstance(v, (bytearray, memoryview)) else v for k, v in value.items()}
    elif kind == EXT:
        return _ext_value(value)
    elif kind == DICT_INTS:
        if isinstance(value, Mapping):
            return {_plain(k): [_plain(v) for v in vs] if isinstance(vs, (list, tuple, np.ndarray)) else vs
                    for k, vs in value.items()}
    return value


def _ext_value(value: object) -> object:
    """An extension value in the form msgpack reads it back: lists for tuples, bytes for buffers."""
    if isinstance(value, Mapping):
        return {_plain(k): _ext_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_ext_value(v) for v in value]
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return _plain(value)


#: Wire name -> message class, for every message of this protocol version.
MESSAGE_TYPES: Mapping[str, type[Message]] = MappingProxyType({
    cls.TYPE: cls
    for cls in (Hello, Welcome, Instruction, Fetch, TransferBegin, TransferFrame, TransferEnd, Report, Ack, Error,
                Bye, Resume, *SECAGG_MESSAGES)
})

_SCHEMAS: dict[type[Message], tuple[tuple[str, str], ...]] = {}
for _cls in MESSAGE_TYPES.values():
    _hints = typing.get_type_hints(_cls)
    _SCHEMAS[_cls] = tuple((f.name, _KINDS[_hints[f.name]]) for f in dataclasses.fields(_cls))
del _cls, _hints


def schema(cls: type[Message]) -> tuple[tuple[str, str], ...]:
    """The ``(field name, kind)`` pairs of a message class, in wire order."""
    return _SCHEMAS[cls]
