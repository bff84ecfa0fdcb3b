"""A secure round's steps on a device's connection: the I/O around :class:`~edge_sdk.secagg.round.DeviceRound`.

After training, a device whose train instruction names ``secagg_session`` advertises its keys,
sends its sealed shares, and uploads its masked blocks in place of its update
(:func:`masked_update`); once the server has the round's uploads it answers the unmasking request
(:func:`reveal`). docs/protocol.md, "Secure aggregation", has the messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.downloads import RoundAborted, next_reply
from edge_sdk.transport import Channel, send_msg

from .fixedpoint import pack_words
from .labels import Scope, SecAggError
from .layout import block_parts
from .round import DeviceRound

__all__ = ["BLOCKS_KEY", "CLIP_KEY", "masked_update", "reveal", "start", "upload_name"]

#: Instruction config keys of a secure round (besides ``protocol.SECAGG_KEY``, its scope).
BLOCKS_KEY = "secagg_blocks"
CLIP_KEY = "secagg_clip"


def upload_name(block: int) -> str:
    """The name of block ``block``'s masked words in the upload: int32 on the wire (the ring words'
    bits), or in a compressed round the words packed at the ring's b bits (uint8, :func:`pack_words`)."""
    return f"secagg.{block}"


def wire_words(rnd: DeviceRound, words: np.ndarray) -> np.ndarray:
    """One block's masked words as they travel: packed at b bits in a compressed round, else int32."""
    fixed = rnd.fixed
    assert fixed is not None
    return pack_words(words, fixed.ring_bits) if rnd.compression is not None else words.view("<i4")


async def _answer(ch: Channel, kind: type[p.Message]) -> p.Message:
    msg = await next_reply(ch)
    if isinstance(msg, p.Ack) and not msg.accepted:
        raise RoundAborted(msg.reason)
    if not isinstance(msg, kind):
        raise p.ProtocolError("unexpected", f"expected {kind.TYPE}, got {msg.TYPE}")
    return msg


async def masked_update(ch: Channel, rnd: DeviceRound, ins: p.Instruction, tensors: Mapping[str, np.ndarray],
                        num_samples: int) -> dict[str, np.ndarray]:
    """Steps 0-2 of ``rnd`` over ``ch``: the upload that replaces the device's update ``tensors``."""
    try:
        cipher, mask, signature, commitments = rnd.advertise()
        await send_msg(ch, p.SecAggKeys(ins.round, cipher, mask, signature, commitments))
        peers = await _answer(ch, p.SecAggPeers)
        # The costly steps (key agreements, signatures, Shamir splits, mask expansion: 0.06 s at 30
        # neighbours) run in a worker thread, so the connection's loop keeps answering pings: an
        # emulator's worker holds hundreds of devices on one loop, and all get their peers at once.
        await send_msg(ch, p.SecAggShares(ins.round, await asyncio.to_thread(rnd.share, peers)))
        inbox = await _answer(ch, p.SecAggInbox)
        await asyncio.to_thread(rnd.receive, inbox.sealed)
        blocks = block_parts(tensors, str(ins.config.get(BLOCKS_KEY, "")).split(","), ins.split)
        words = await asyncio.to_thread(rnd.mask, blocks, num_samples)
    except SecAggError as exc:  # the server relayed something the protocol forbids: follow it no further
        raise p.ProtocolError("malformed", f"secure round: {exc}") from None
    return {upload_name(b): wire_words(rnd, w) for b, w in enumerate(words, start=ins.split)}


def start(device_id: str, secret: str, ins: p.Instruction, num_blocks: int, min_survivors: int) -> DeviceRound:
    """The device's state for the secure round ``ins`` opens; ``min_survivors``: the device's own t."""
    if not secret:
        raise p.ProtocolError("refused", "secure aggregation needs the device's credential (its secret) to sign keys")
    return DeviceRound(device_id, secret, Scope(str(ins.config[p.SECAGG_KEY]), ins.round), ins.split, num_blocks,
                       min_survivors=min_survivors)


async def reveal(ch: Channel, rnd: DeviceRound | None, msg: p.SecAggUnmask) -> str:
    """Step 3: answer the unmasking request of ``msg.round`` (a request for a round this device
    has no state of is refused: the server asked the wrong device, or one that left the round): the device's signature
    on the survivor set, then, asked again with the signers' signatures, its shares. A request the device
    refuses (a block short of t survivors, both secrets of one peer) gets no answer: the device stays
    connected for the next round, and the refusal is returned ("" when it answered)."""
    if rnd is None or rnd.scope.round != msg.round:  # not answered: the device stays for the next round
        return f"secure round: an unmasking request for round {msg.round}, which this device did not mask (or left)"
    try:
        if not msg.signatures:  # the consistency round's first request: sign the survivor set
            await send_msg(ch, p.SecAggReveal(msg.round, {}, {}, rnd.consent(msg.survivor_set)))
            return ""
        seeds, keys = rnd.reveal(msg.survivors, msg.dropped, msg.blocks, msg.survivor_set, msg.signatures)
    except SecAggError as exc:
        return f"secure round: {exc}"
    await send_msg(ch, p.SecAggReveal(msg.round, seeds, keys))
    return ""
