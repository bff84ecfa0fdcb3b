"""Codecs on the wire: how a payload or an update travels encoded (docs/protocol.md, "Codecs on the wire").

The server chooses, per payload kind, a codec for what it sends (``chunk-codec``, ``tail-codec``,
``graph-codec``) and one for the updates devices send back (``update-codec``). A payload sent
encoded names its codec in ``TransferBegin.meta["codec"]``; an instruction names the update's in
``config["update_codec"]``, and ``config["update_feedback"]`` asks for error feedback (Stich et
al. 2018; Karimireddy et al. 2019, Algorithm 2) where the codec is biased (``float16``, ``int8``).

Two forms, both built on :mod:`edge_sdk.codecs` records:

- a byte payload (an ONNX chunk, a training graph) through a lossless codec is one record holding
  the bytes (:func:`edge_sdk.codecs.encode_bytes`);
- a state (the tail's weights, an update) through any codec is an ``encode_tensors`` payload whose
  every dense entry is a record (a uint8 vector): float32 entries through the codec, the others
  through ``none``; row-sparse entries travel as they are.

Decoding checks what it is given as the protocol does: a record that does not decode, a tensor
over the limits, or NaN/infinity is a ``malformed``/``too_large``/``non_finite`` ``ProtocolError``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.protocol.codec import BytesLike

__all__ = ["CODEC_META", "DELTA_BASE_META", "DELTA_CODEC", "FEEDBACK_KEY", "RECON_META", "UPDATE_CODEC_KEY",
           "UpdateEncoder", "decode_payload", "decode_state", "encode_payload", "encode_state", "needs_feedback",
           "tensor_regions"]

#: ``TransferBegin.meta`` key naming the codec a payload was sent through (absent: none).
CODEC_META = "codec"
#: Delta downloads (:mod:`edge_sdk.codecs.delta`): the codec name, and the ``TransferBegin.meta`` keys
#: naming the sha256 of the bytes the device rebuilds (``recon``) and of the base it applies to (``base``,
#: absent for a payload sent against nothing). The instruction's digest of such a payload is its ``recon``.
DELTA_CODEC, RECON_META, DELTA_BASE_META = "delta", "recon", "base"
#: Instruction ``config`` keys: the update's codec, and whether the device keeps error feedback.
UPDATE_CODEC_KEY, FEEDBACK_KEY = "update_codec", "update_feedback"


def needs_feedback(name: str) -> bool:
    """Whether a codec is biased and lossy, so that error feedback keeps what it leaves out."""
    from edge_sdk.codecs import codec

    chosen = codec(name)
    return not chosen.lossless and not chosen.unbiased


def encode_state(tensors: Mapping[str, object], name: str, *, feedback=None, seed: int | None = None) -> bytes:
    """``tensors`` as an ``encode_tensors`` payload of codec records (``feedback``: an
    :class:`edge_sdk.codecs.ErrorFeedback` whose residuals fold into the float32 entries)."""
    from edge_sdk.codecs import codec

    chosen, plain = codec(name), codec("none")
    out: dict[str, object] = {}
    for key, value in tensors.items():
        if not isinstance(value, np.ndarray):
            out[key] = value  # row-sparse: as it is
            continue
        lossy = value.dtype == np.float32 and not chosen.lossless
        if lossy and feedback is not None:
            record = feedback.encode(key, value, chosen, seed=seed)
        else:
            record = (chosen if lossy or chosen.lossless else plain).encode(np.asarray(value, order="C"), seed=seed)
        out[key] = np.frombuffer(record, dtype=np.uint8)
    return p.encode_tensors(out)


def decode_state(data: BytesLike, limits: p.Limits = p.DEFAULT_LIMITS) -> dict[str, object]:
    """The tensors of :func:`encode_state`'s payload (a uint8 vector entry is a record; anything
    else is taken as it is), checked as ``decode_tensors`` checks."""
    from edge_sdk.codecs import CodecError, decode

    out: dict[str, object] = {}
    for key, value in p.decode_tensors(data, limits).items():
        if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
            try:
                value = decode(memoryview(value), max_bytes=limits.max_tensor_bytes)
            except CodecError as exc:
                raise p.ProtocolError(p.ErrorCode.MALFORMED, f"tensor {key[:64]!r}: {exc}") from None
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise p.ProtocolError(p.ErrorCode.NON_FINITE, f"tensor {key[:64]!r} holds NaN or infinity")
        out[key] = value
    return out


def tensor_regions(data: BytesLike) -> np.ndarray:
    """The ``(offset, count)`` regions of an ``encode_tensors`` payload's float32 tensors (of at
    least 64 values: small ones stay exact), in increasing order: what a delta download rewrites."""
    views = p.decode_tensors(data, allow_non_finite=True)
    start = np.frombuffer(data, dtype=np.uint8).ctypes.data
    found = sorted((v.ctypes.data - start, v.size) for v in views.values()
                   if isinstance(v, np.ndarray) and v.dtype == np.float32 and v.size >= 64)
    return np.array(found, dtype=np.int64).reshape(-1, 2)


def encode_payload(data: BytesLike, name: str, kind: str) -> bytes:
    """A payload of ``kind`` as it travels through codec ``name``: a tail's state through any
    codec, every other payload (ONNX bytes) through a lossless one."""
    if kind == "model":
        return encode_state(p.decode_tensors(data, allow_non_finite=False), name)
    from edge_sdk.codecs import encode_bytes

    return encode_bytes(name, memoryview(data))


def decode_payload(data: BytesLike, name: str, kind: str, limits: p.Limits = p.DEFAULT_LIMITS) -> bytes:
    """The payload bytes :func:`encode_payload` encoded (a tail as a plain ``encode_tensors`` payload)."""
    if kind == "model":
        return p.encode_tensors(decode_state(data, limits))  # type: ignore[arg-type]
    from edge_sdk.codecs import CodecError, decode_bytes

    try:
        return decode_bytes(data, max_bytes=limits.max_transfer_bytes)
    except CodecError as exc:
        raise p.ProtocolError(p.ErrorCode.MALFORMED, f"a {kind} payload through {name}: {exc}") from None


class UpdateEncoder:
    """A device's updates, each as its instruction asks it to travel; the error-feedback residuals
    (one per tensor name) carry over from round to round, as EF-SGD's memory does."""

    def __init__(self) -> None:
        self.feedback = None  # an edge_sdk.codecs.ErrorFeedback, made on first use

    def encode(self, tensors: Mapping[str, object], config: Mapping[str, p.Scalar]) -> bytes:
        name = str(config.get(UPDATE_CODEC_KEY, "none"))
        if name == "none":
            return p.encode_tensors(tensors)  # type: ignore[arg-type]
        from edge_sdk.codecs import ErrorFeedback

        if config.get(FEEDBACK_KEY) and self.feedback is None:
            self.feedback = ErrorFeedback()
        try:
            return encode_state(tensors, name, feedback=self.feedback if config.get(FEEDBACK_KEY) else None)
        except ValueError as exc:  # a codec this device does not know
            raise p.ProtocolError(p.ErrorCode.MALFORMED, f"instruction's update codec: {exc}") from None
