"""The wire protocol between the orchestrator and devices (specification: docs/protocol.md).

Sans-I/O, like the ``websockets`` library's protocol layer: pure functions and small state machines
over bytes, testable without sockets. Every message is one binary websocket message holding a
msgpack map; large payloads (model chunks, updates) stream as bounded frames with a sha256 and
resume. :mod:`edge_sdk.transport` does the I/O over ``websockets``.

Imports numpy and msgpack only (never torch or onnx), so devices without torch can use it.
"""

from .codec import DEFAULT_LIMITS, Limits, decode, encode
from .errors import ErrorCode, ProtocolError
from .messages import (
    MESSAGE_TYPES,
    PAYLOAD_KINDS,
    TRAIN_GRAPH_KEY,
    PHASES,
    TENSOR_PHASES,
    PROBE_STEP_MAX_S,
    PROTOCOL_VERSION,
    Ack,
    Bye,
    Error,
    Fetch,
    Hello,
    Message,
    Instruction,
    Report,
    Resume,
    SECAGG_KEY,
    SECAGG_MESSAGES,
    SELECTIONS,
    SecAggInbox,
    SecAggKeys,
    SecAggPeers,
    SecAggReveal,
    SecAggShares,
    SecAggUnmask,
    Scalar,
    TransferBegin,
    TransferEnd,
    TransferFrame,
    Welcome,
)
from .session import DeviceSession, ServerSession, SessionState
from .tensors import DTYPES, TENSOR_EXT, RowSparse, decode_tensors, encode_tensors
from .transfer import DEFAULT_FRAME_SIZE, IncomingTransfer, frames, sha256_hex

__all__ = [
    "PROBE_STEP_MAX_S",
    "PROTOCOL_VERSION",
    "ErrorCode",
    "ProtocolError",
    "Limits",
    "DEFAULT_LIMITS",
    "encode",
    "decode",
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
    "MESSAGE_TYPES",
    "PHASES",
    "TENSOR_PHASES",
    "SELECTIONS",
    "PAYLOAD_KINDS",
    "TRAIN_GRAPH_KEY",
    "RowSparse",
    "TENSOR_EXT",
    "DTYPES",
    "encode_tensors",
    "decode_tensors",
    "DEFAULT_FRAME_SIZE",
    "frames",
    "sha256_hex",
    "IncomingTransfer",
    "SessionState",
    "DeviceSession",
    "ServerSession",
]
