"""Session state machines: both sides of a connection agree on every legal conversation and refuse
every illegal move with a ProtocolError that changes nothing. No sockets."""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sdk.protocol import (
    PHASES,
    SELECTIONS,
    Ack,
    Bye,
    Error,
    ErrorCode,
    Fetch,
    Hello,
    Instruction,
    ProtocolError,
    Report,
    Resume,
    TransferBegin,
    TransferEnd,
    TransferFrame,
    Welcome,
    frames,
    sha256_hex,
)
from edge_sdk.protocol.session import DeviceSession, ServerSession, SessionState, payload_kinds

S = SessionState
HELLO = Hello(device_id="pi-1", token="t", budget_bytes=64 << 20, cores=1, runtimes=["onnxruntime"], num_samples=50)
WELCOME = Welcome("pi-1", "weak", 2, 4, [(0, 1), (1, 2)], "resnet20", 0, 16, 2, {})
FRAME = 8


def instruction(round: int = 0, phase: str = "train", *, chunk_ids=("c0", "c1"), model_id: str = "m0",
                broadcast_id: str = "", selection: str = "tail") -> Instruction:
    return Instruction(round=round, phase=phase, model_version=round, split=len(chunk_ids),
                       chunk_ids=list(chunk_ids), model_id=model_id, selection=selection,
                       broadcast_id=broadcast_id, local_steps=2, lr=0.05, deadline_s=60.0, config={})


TRAIN = instruction()
EVALUATE = instruction(0, "evaluate", chunk_ids=(), model_id="m0")
COMPARE = instruction(0, "compare", chunk_ids=("c0",), broadcast_id="b0")


def snapshot(session) -> dict:
    """Everything a session holds, so that a refused message can be shown to change nothing."""
    out = {k: v for k, v in vars(session).items() if k not in ("_flow", "_pending")}
    out["_pending"] = list(session._pending)
    flow = session._flow
    out["_flow"] = None if flow is None else (flow.begin, flow.offset, flow.end_due)
    return out


def view(session) -> tuple:
    """What both sides must agree on once they have seen the same messages."""
    return (session.state, session.round, session.instruction, list(session.pending), session.fetch,
            session.transfer, session.report, session.hello, session.welcome)


class Pair:
    """A device session and a server session fed the same messages, in the same order."""

    def __init__(self) -> None:
        self.device = DeviceSession()
        self.server = ServerSession()

    def up(self, msg) -> None:  # device -> server
        self.device.send(msg)
        self.server.receive(msg)

    def down(self, msg) -> None:  # server -> device
        self.server.send(msg)
        self.device.receive(msg)

    def agree(self) -> None:
        assert view(self.device) == view(self.server)

    # -- walking to a point of the conversation -------------------------------------------------
    def welcomed(self, hello: Hello = HELLO) -> Pair:
        self.up(hello)
        self.down(WELCOME)
        return self

    def working(self, instr: Instruction = TRAIN) -> Pair:
        self.welcomed()
        self.down(instr)
        return self

    def download(self, payload_id: str, payload: bytes, *, kind: str | None = None, known: bool = False,
                 offset: int = 0, stop_after: int | None = None) -> list:
        """Fetch ``payload_id`` and stream it (all of it, or its first ``stop_after`` messages)."""
        instr = self.device.instruction
        kind = kind or sorted(payload_kinds(instr)[payload_id])[0]
        self.up(Fetch(instr.round, payload_id, offset))
        msgs = list(frames(payload, transfer_id=f"{payload_id}-r{instr.round}", kind=kind, meta={},
                           frame_size=FRAME, offset=offset, sha256=sha256_hex(payload) if known else None))
        for msg in msgs[:stop_after]:
            self.down(msg)
        return msgs

    def upload(self, transfer_id: str, payload: bytes, offset: int = 0, stop_after: int | None = None) -> list:
        msgs = list(frames(payload, transfer_id=transfer_id, kind="update", meta={}, frame_size=FRAME, offset=offset))
        for msg in msgs[:stop_after]:
            self.up(msg)
        return msgs


def refused(call, msg, code: str = ErrorCode.UNEXPECTED, *, session=None) -> ProtocolError:
    """``call(msg)`` raises ProtocolError(code) and leaves the session exactly as it was."""
    session = session or call.__self__
    before = snapshot(session)
    with pytest.raises(ProtocolError) as info:
        call(msg)
    assert info.value.code == code, info.value
    assert snapshot(session) == before
    return info.value


def both_refuse(pair: Pair, msg, code: str = ErrorCode.UNEXPECTED, *, from_device: bool) -> None:
    """The sender's session refuses to send it, and the receiver's refuses to take it."""
    if from_device:
        refused(pair.device.send, msg, code)
        refused(pair.server.receive, msg, code)
    else:
        refused(pair.server.send, msg, code)
        refused(pair.device.receive, msg, code)


# --- legal conversations -----------------------------------------------------------------------------


def test_a_train_round():
    pair = Pair()
    for side in (pair.device, pair.server):
        assert (side.state, side.round, side.instruction, list(side.pending)) == (S.HELLO, -1, None, [])
        assert not side.closed
    pair.up(HELLO)
    assert pair.device.state is pair.server.state is S.WELCOMING
    pair.down(WELCOME)
    assert pair.device.state is S.IDLE and pair.device.welcome == WELCOME
    pair.down(TRAIN)
    assert pair.device.state is S.WORKING and pair.device.instruction == TRAIN and pair.device.round == 0
    pair.agree()
    # Chunks in order, the first hashed while streaming (a transfer_end), the second with a known digest.
    msgs = pair.download("c0", bytes(range(30)), stop_after=2)
    assert pair.device.transfer == msgs[0] and pair.device.fetch is None
    pair.agree()
    for msg in msgs[2:]:
        pair.down(msg)
    assert isinstance(msgs[-1], TransferEnd) and pair.device.transfer is None
    pair.download("c1", b"x" * 17, known=True)
    pair.download("m0", b"model" * 5)
    pair.agree()
    assert pair.device.state is S.WORKING
    report = Report(0, "train", 50, (2, 4), "u-1", {"loss_before": 2.3, "loss_after": 1.9})
    pair.up(report)
    assert pair.device.state is S.UPLOADING and pair.device.report == report
    msgs = pair.upload("u-1", b"deltas" * 7, stop_after=3)
    assert pair.device.state is S.UPLOADING and pair.device.transfer == msgs[0]
    pair.agree()
    for msg in msgs[3:]:
        pair.up(msg)
    assert pair.device.state is pair.server.state is S.AWAITING_ACK
    pair.agree()
    pair.down(Ack(0, True, "", "train"))
    for side in (pair.device, pair.server):
        assert (side.state, side.round, side.instruction, side.report) == (S.IDLE, -1, None, None)
    pair.agree()
    pair.down(Bye("training finished"))
    assert pair.device.closed and pair.server.closed and pair.device.close_message == Bye("training finished")


def test_an_evaluate_round_reports_without_a_transfer():
    pair = Pair().working(EVALUATE)
    pair.download("m0", b"m" * 20, known=True)
    pair.up(Report(0, "evaluate", 50, (0, 0), "", {"loss": 0.7, "accuracy": 0.8}))
    assert pair.device.state is pair.server.state is S.AWAITING_ACK
    pair.down(Ack(0, True, "", "evaluate"))
    assert pair.device.state is pair.server.state is S.IDLE
    pair.agree()


def test_a_compare_round_fetches_the_broadcast():
    pair = Pair().working(COMPARE)
    assert payload_kinds(COMPARE) == {"c0": {"chunk"}, "m0": {"model"}, "b0": {"broadcast"}}
    pair.download("c0", b"c" * 9)
    pair.download("m0", b"m" * 9)
    pair.download("b0", b"b" * 9)
    pair.up(Report(0, "compare", 50, (0, 0), "", {"sq_distance": 1.5, "dot": 0.25, "sq_norm": 2.0}))
    pair.down(Ack(0, False, "not chosen", "compare"))
    assert pair.device.state is S.IDLE
    pair.agree()


def test_payloads_may_be_fetched_in_any_order_and_again():
    pair = Pair().working(TRAIN)
    pair.download("m0", b"m" * 9)
    pair.download("c1", b"c" * 9)
    pair.download("c1", b"c" * 9, offset=4)  # again, resuming: the transfer starts where the device asked
    pair.download("c0", b"", known=True)  # an empty payload with its digest: complete at once
    assert pair.device.transfer is None
    pair.download("c0", b"")  # empty, digest last: only the transfer_end is due
    assert pair.device.transfer is None
    pair.agree()


def test_a_follow_up_instruction_is_queued_while_the_first_is_worked_on():
    pair = Pair().working(EVALUATE)
    follow_up = instruction(0, "train", chunk_ids=("c0",), model_id="m1", selection="rows")
    msgs = pair.download("m0", b"m" * 20, stop_after=0)  # the fetch is out, not answered yet
    pair.down(follow_up)  # mid-fetch
    for side in (pair.device, pair.server):
        assert side.instruction == EVALUATE and list(side.pending) == [follow_up] and side.state is S.WORKING
    for msg in msgs:
        pair.down(msg)
    pair.up(Report(0, "evaluate", 50, (0, 0), "", {"loss": 0.4}))
    pair.down(Ack(0, True, "", "evaluate"))
    # The server moves on by itself; the device when it takes the next instruction.
    assert pair.server.state is S.WORKING and pair.server.instruction == follow_up and not pair.server.pending
    assert pair.device.state is S.IDLE and list(pair.device.pending) == [follow_up]
    assert pair.device.next_instruction() == follow_up
    assert pair.device.state is S.WORKING and not pair.device.pending
    pair.agree()
    with pytest.raises(ProtocolError):  # the evaluate instruction is over: its payloads are gone
        pair.device.send(Fetch(0, "m0"))
    pair.download("c0", b"c" * 3)
    pair.download("m1", b"m" * 3)
    pair.up(Report(0, "train", 50, (1, 4), "u-2", {"loss_before": 1.0, "loss_after": 0.5}))
    third = instruction(1, "evaluate", chunk_ids=(), model_id="m2")
    pair.down(third)  # while uploading
    pair.upload("u-2", b"d" * 20)
    pair.down(third := dataclasses.replace(third, config={"n": 1}))  # and while awaiting the ack
    pair.down(Ack(0, True, "", "train"))
    assert pair.device.next_instruction().config == {}
    assert pair.device.round == 1 and len(pair.device.pending) == 1
    pair.agree()


def test_an_instruction_to_an_idle_device_with_a_queue_joins_the_queue():
    pair = Pair().working(EVALUATE)
    second, third = instruction(0, "train", model_id="m1"), instruction(1, "train", model_id="m2")
    pair.down(second)
    pair.download("m0", b"m")
    pair.up(Report(0, "evaluate", 5, (0, 0), "", {"loss": 1.0}))
    pair.down(Ack(0, True, "", "evaluate"))
    pair.down(third)  # before the device took `second`: it must not jump the queue
    assert pair.device.state is S.IDLE and list(pair.device.pending) == [second, third]
    assert pair.device.next_instruction() == second
    pair.agree()


def test_next_instruction():
    pair = Pair()
    assert pair.device.next_instruction() is None  # nothing to take before the welcome
    pair.welcomed()
    assert pair.device.next_instruction() is None  # idle, nothing pending
    pair.down(EVALUATE)
    pair.down(TRAIN)
    refused(lambda _: pair.device.next_instruction(), None, session=pair.device)  # not while working
    pair.download("m0", b"m")
    pair.up(Report(0, "evaluate", 1, (0, 0), "", {}))
    refused(lambda _: pair.device.next_instruction(), None, session=pair.device)  # nor awaiting the ack
    pair.down(Bye("stopping"))
    assert pair.device.next_instruction() is None  # closed: nothing more to do
    assert list(pair.device.pending) == [TRAIN]


def test_a_fetch_of_a_closed_round_is_answered_by_an_ack_that_drops_the_instruction():
    pair = Pair().working(TRAIN)
    later = instruction(1, "train", model_id="m1")
    pair.down(later)
    pair.up(Fetch(0, "c0"))
    pair.down(Ack(0, False, "round closed"))
    assert pair.device.state is S.IDLE and pair.device.instruction is None and pair.device.round == -1
    assert pair.server.state is S.WORKING and pair.server.instruction == later
    pair.device.next_instruction()
    pair.agree()
    pair.up(Fetch(1, "c0"))
    pair.down(Ack(1, False, "round closed", "train"))  # the phase may be named too
    assert pair.device.state is pair.server.state is S.IDLE
    pair.agree()


@pytest.mark.parametrize("known", [True, False])
def test_a_resumed_upload(known):
    pair = Pair().welcomed(dataclasses.replace(HELLO, resume_round=4))
    pair.down(Resume("u-9", 16))
    for side in (pair.device, pair.server):
        assert (side.state, side.round, side.instruction, side.report) == (S.UPLOADING, 4, None, None)
    payload = bytes(40)
    msgs = list(frames(payload, transfer_id="u-9", kind="update", meta={}, frame_size=FRAME, offset=16,
                       sha256=sha256_hex(payload) if known else None))
    both_refuse(pair, dataclasses.replace(msgs[0], offset=0), ErrorCode.OUT_OF_ORDER, from_device=True)
    for msg in msgs:
        pair.up(msg)
    assert pair.device.state is S.AWAITING_ACK
    both_refuse(pair, Ack(3, True), from_device=False)
    pair.down(Ack(4, True, "", "train"))  # the phase of a report sent on the lost connection: any
    assert pair.device.state is S.IDLE and pair.device.round == -1
    pair.down(instruction(4, "compare", broadcast_id="b0"))  # a follow-up of that round
    pair.agree()


def test_a_resumed_upload_that_was_complete_but_for_its_end():
    pair = Pair().welcomed(dataclasses.replace(HELLO, resume_round=0))
    pair.down(Resume("u-1", 10))
    pair.up(TransferBegin("u-1", "update", 10, sha256_hex(bytes(10)), FRAME, 10, {}))
    assert pair.device.state is S.AWAITING_ACK  # nothing left to send


@pytest.mark.parametrize("closer", [Error("refused", "full"), Bye("stopping")])
def test_error_or_bye_closes_from_any_state_either_way(closer):
    def at(n: int) -> Pair:
        pair = Pair()
        steps = [lambda: pair.up(HELLO), lambda: pair.down(WELCOME), lambda: pair.down(TRAIN),
                 lambda: pair.up(Fetch(0, "c0")), lambda: pair.down(TransferBegin("t", "chunk", 10, "", 4, 0, {})),
                 lambda: pair.down(TransferFrame("t", 0, b"1234"))]
        for step in steps[:n]:
            step()
        return pair

    for n in range(7):
        for from_device in (True, False):
            pair = at(n)
            (pair.up if from_device else pair.down)(closer)
            for side in (pair.device, pair.server):
                assert side.closed and side.state is S.CLOSED and side.close_message == closer
            # Nothing is sent after a close. What the closer receives crossed its close on the wire and is
            # dropped (False); what the other side receives after the close it was sent breaks the protocol.
            closer_side, other = (pair.device, pair.server) if from_device else (pair.server, pair.device)
            for msg in (HELLO, Bye(), Error("malformed", "x"), Fetch(0, "c0")):
                refused(pair.device.send, msg)
                if from_device:
                    refused(pair.server.receive, msg)
                else:
                    assert pair.server.receive(msg) is False
            for msg in (WELCOME, TRAIN, Bye(), Ack(0, True)):
                refused(pair.server.send, msg)
                if from_device:
                    assert pair.device.receive(msg) is False
                else:
                    refused(pair.device.receive, msg)
            for side in (closer_side, other):
                assert side.state is S.CLOSED and side.close_message == closer


def test_reports_of_every_phase_and_unknown_phases():
    for phase, transfer_id in (("evaluate", ""), ("compare", ""), ("train", "u"), ("distill", ""), ("distill", "u")):
        pair = Pair().working(instruction(0, phase, chunk_ids=()))
        pair.download("m0", b"m")
        pair.up(Report(0, phase, 1, (0, 0), transfer_id, {}))
        assert pair.device.state is (S.UPLOADING if transfer_id else S.AWAITING_ACK)


# --- illegal moves -----------------------------------------------------------------------------------


def test_nothing_but_hello_before_the_hello():
    pair = Pair()
    both_refuse(pair, WELCOME, from_device=False)
    both_refuse(pair, TRAIN, from_device=False)  # an instruction before the welcome
    both_refuse(pair, Fetch(0, "c0"), from_device=True)
    both_refuse(pair, Ack(0, True), from_device=False)
    both_refuse(pair, Resume("u", 0), from_device=False)
    both_refuse(pair, TransferBegin("u", "update", 1, "", 1, 0, {}), from_device=True)
    pair.up(HELLO)
    both_refuse(pair, HELLO, from_device=True)  # one hello per connection
    both_refuse(pair, TRAIN, from_device=False)  # still before the welcome
    both_refuse(pair, Report(0, "train", 1, (0, 1), "u", {}), from_device=True)
    pair.down(WELCOME)
    both_refuse(pair, WELCOME, from_device=False)  # one welcome


@pytest.mark.parametrize("msg", [WELCOME, TRAIN, Ack(0, True), Resume("u", 0)], ids=lambda m: m.TYPE)
def test_a_device_never_sends_what_the_server_sends(msg):
    pair = Pair().working()
    both_refuse(pair, msg, from_device=True)


@pytest.mark.parametrize("msg", [HELLO, Fetch(0, "c0"), Report(0, "train", 1, (0, 1), "u", {})],
                         ids=lambda m: m.TYPE)
def test_a_server_never_sends_what_a_device_sends(msg):
    pair = Pair().working()
    both_refuse(pair, msg, from_device=False)


def test_not_a_message():
    pair = Pair()
    for call in (pair.device.send, pair.device.receive, pair.server.send, pair.server.receive):
        refused(call, {"t": "hello"}, ErrorCode.MALFORMED)


def test_fetches_must_name_a_payload_of_the_current_instruction():
    pair = Pair().welcomed()
    both_refuse(pair, Fetch(0, "c0"), from_device=True)  # idle: no instruction
    pair.down(TRAIN)
    error = refused(pair.server.receive, Fetch(0, "c7"))
    assert "'c7'" in error.message  # the server names the payload it was asked for
    both_refuse(pair, Fetch(0, "c7"), from_device=True)
    both_refuse(pair, Fetch(0, "b0"), from_device=True)  # no broadcast in this instruction
    both_refuse(pair, Fetch(1, "c0"), from_device=True)  # another round
    pair.up(Fetch(0, "c0"))
    both_refuse(pair, Fetch(0, "c1"), from_device=True)  # one fetch at a time
    pair.down(TransferBegin("t", "chunk", 10, "", 4, 0, {}))
    both_refuse(pair, Fetch(0, "c1"), from_device=True)  # not during a transfer either


def test_transfers_must_answer_the_fetch():
    pair = Pair().working(COMPARE)
    both_refuse(pair, TransferBegin("t", "chunk", 10, "", 4, 0, {}), from_device=False)  # no fetch
    pair.up(Fetch(0, "b0", offset=6))
    both_refuse(pair, TransferBegin("t", "model", 10, "", 4, 6, {}), from_device=False)  # wrong kind
    both_refuse(pair, TransferBegin("t", "update", 10, "", 4, 6, {}), from_device=False)
    both_refuse(pair, TransferBegin("t", "broadcast", 10, "", 4, 3, {}), ErrorCode.OUT_OF_ORDER, from_device=False)
    both_refuse(pair, TransferFrame("t", 6, b"x"), from_device=False)  # a frame before its begin
    both_refuse(pair, TransferBegin("t", "broadcast", 10, "", 4, 6, {}), from_device=True)  # not an upload
    pair.down(TransferBegin("t", "broadcast", 10, "", 4, 0, {}))  # from 0 is fine: the server starts again
    pair.agree()


def test_frames_of_a_download():
    pair = Pair().working()
    pair.up(Fetch(0, "c0"))
    pair.down(TransferBegin("t", "chunk", 10, "", 4, 0, {}))
    both_refuse(pair, TransferFrame("other", 0, b"1234"), from_device=False)  # a frame of another transfer
    both_refuse(pair, TransferFrame("t", 4, b"1234"), ErrorCode.OUT_OF_ORDER, from_device=False)  # skips bytes
    both_refuse(pair, TransferFrame("t", 0, b"12345"), ErrorCode.TOO_LARGE, from_device=False)  # > frame_size
    both_refuse(pair, TransferFrame("t", 0, b"1234"), from_device=True)  # the device sends no frame now
    both_refuse(pair, TransferEnd("t", "0" * 64), ErrorCode.OUT_OF_ORDER, from_device=False)  # bytes missing
    both_refuse(pair, instruction(0, "evaluate"), from_device=False)  # nothing inside a transfer
    both_refuse(pair, Ack(0, False), from_device=False)  # the fetch is answered already
    both_refuse(pair, Report(0, "train", 1, (2, 4), "u", {}), from_device=True)
    pair.down(TransferFrame("t", 0, b"1234"))
    pair.down(TransferFrame("t", 4, b"1234"))
    both_refuse(pair, TransferFrame("t", 8, b"123"), ErrorCode.TOO_LARGE, from_device=False)  # past the end
    pair.down(TransferFrame("t", 8, b"12"))
    both_refuse(pair, TransferEnd("other", "0" * 64), from_device=False)
    both_refuse(pair, TransferFrame("t", 10, b"1"), ErrorCode.TOO_LARGE, from_device=False)
    pair.down(TransferEnd("t", "0" * 64))  # the session counts bytes; IncomingTransfer checks the digest
    both_refuse(pair, TransferEnd("t", "0" * 64), from_device=False)  # a second end: no transfer in flight
    both_refuse(pair, TransferFrame("t", 10, b"1"), from_device=False)
    # With the digest first, no end is due.
    pair.up(Fetch(0, "c1"))
    pair.down(TransferBegin("k", "chunk", 2, "0" * 64, 4, 0, {}))
    pair.down(TransferFrame("k", 0, b"12"))
    both_refuse(pair, TransferEnd("k", "0" * 64), from_device=False)
    pair.agree()


def test_reports_must_answer_the_current_instruction():
    pair = Pair().welcomed()
    both_refuse(pair, Report(0, "train", 1, (2, 4), "u", {}), from_device=True)  # idle
    pair.down(TRAIN)
    both_refuse(pair, Report(0, "evaluate", 1, (0, 0), "", {}), from_device=True)  # the wrong phase
    both_refuse(pair, Report(1, "train", 1, (2, 4), "u", {}), from_device=True)  # the wrong round
    both_refuse(pair, Report(0, "train", 1, (2, 4), "", {}), from_device=True)  # training reports tensors
    pair.up(Fetch(0, "c0"))
    both_refuse(pair, Report(0, "train", 1, (2, 4), "u", {}), from_device=True)  # the fetch is unanswered
    for phase in ("evaluate", "compare"):
        other = Pair().working(instruction(0, phase, broadcast_id="b0"))
        both_refuse(other, Report(0, phase, 1, (0, 0), "u", {}), from_device=True)  # no tensors in these
    pair = Pair().working(EVALUATE)
    pair.up(Report(0, "evaluate", 1, (0, 0), "", {}))
    both_refuse(pair, Report(0, "evaluate", 1, (0, 0), "", {}), from_device=True)  # one report per instruction


def test_the_upload_must_be_the_reports():
    pair = Pair().working()
    pair.up(Report(0, "train", 1, (2, 4), "u-1", {}))
    both_refuse(pair, TransferBegin("u-2", "update", 4, "", 4, 0, {}), from_device=True)  # another id
    both_refuse(pair, TransferBegin("u-1", "chunk", 4, "", 4, 0, {}), from_device=True)  # not an update
    both_refuse(pair, TransferBegin("u-1", "update", 4, "", 4, 2, {}), ErrorCode.OUT_OF_ORDER, from_device=True)
    both_refuse(pair, TransferBegin("u-1", "update", 4, "", 4, 0, {}), from_device=False)  # the wrong way
    both_refuse(pair, TransferFrame("u-1", 0, b"1234"), from_device=True)  # no begin yet
    both_refuse(pair, Ack(0, True, "", "train"), from_device=False)  # before the upload
    both_refuse(pair, Fetch(0, "c0"), from_device=True)
    pair.up(TransferBegin("u-1", "update", 6, "", 4, 0, {}))
    both_refuse(pair, TransferFrame("u-0", 0, b"1234"), from_device=True)  # a frame of another transfer
    both_refuse(pair, TransferFrame("u-1", 0, b"1234"), from_device=False)  # frames of an upload go up
    pair.up(TransferFrame("u-1", 0, b"1234"))
    pair.up(TransferFrame("u-1", 4, b"56"))
    both_refuse(pair, Ack(0, True, "", "train"), from_device=False)  # its transfer_end is still due
    pair.up(TransferEnd("u-1", "0" * 64))
    assert pair.device.state is S.AWAITING_ACK
    both_refuse(pair, TransferFrame("u-1", 6, b"7"), from_device=True)
    pair.agree()


def test_acks_must_answer_a_report_or_a_fetch():
    pair = Pair().welcomed()
    both_refuse(pair, Ack(0, True), from_device=False)  # idle
    pair.down(TRAIN)
    both_refuse(pair, Ack(0, True, "", "train"), from_device=False)  # before the report
    both_refuse(pair, Ack(0, False, "round closed"), from_device=False)  # no fetch to answer
    pair.up(Fetch(0, "c0"))
    both_refuse(pair, Ack(0, True), from_device=False)  # a fetch is answered by ack(false) only
    both_refuse(pair, Ack(1, False), from_device=False)  # of the fetch's round
    both_refuse(pair, Ack(0, False, "", "evaluate"), from_device=False)  # and the instruction's phase
    pair = Pair().working(EVALUATE)
    pair.download("m0", b"m")
    pair.up(Report(0, "evaluate", 1, (0, 0), "", {}))
    both_refuse(pair, Ack(1, True, "", "evaluate"), from_device=False)  # another round
    both_refuse(pair, Ack(0, True, "", "train"), from_device=False)  # another phase
    both_refuse(pair, Ack(0, True), from_device=False)  # the phase of the report is named
    pair.down(Ack(0, True, "", "evaluate"))
    both_refuse(pair, Ack(0, True, "", "evaluate"), from_device=False)  # one ack per report


def test_instructions_come_in_round_order():
    pair = Pair().working(instruction(3))
    both_refuse(pair, instruction(2), from_device=False)
    pair.down(instruction(3, "evaluate"))  # the same round is fine
    pair.down(instruction(5))


def test_resume_only_right_after_the_welcome_of_a_resumed_session():
    fresh = Pair().welcomed()
    both_refuse(fresh, Resume("u", 0), from_device=False)  # the hello resumed no round
    pair = Pair()
    pair.up(dataclasses.replace(HELLO, resume_round=2))
    both_refuse(pair, Resume("u", 0), from_device=False)  # before the welcome
    pair.down(WELCOME)
    pair.down(instruction(2))
    both_refuse(pair, Resume("u", 0), from_device=False)  # working
    pair = Pair().welcomed(dataclasses.replace(HELLO, resume_round=2))
    pair.down(instruction(2, "evaluate", chunk_ids=()))
    pair.download("m0", b"m")
    pair.up(Report(2, "evaluate", 1, (0, 0), "", {}))
    pair.down(Ack(2, True, "", "evaluate"))
    both_refuse(pair, Resume("u", 0), from_device=False)  # idle again, but after an instruction
    pair = Pair().welcomed(dataclasses.replace(HELLO, resume_round=2))
    pair.down(Resume("u", 0))
    pair.upload("u", b"12345")
    pair.down(Ack(2, True))
    both_refuse(pair, Resume("u", 0), from_device=False)  # once
    both_refuse(pair, instruction(1), from_device=False)  # and rounds do not go back past the resumed one


# --- random conversations ----------------------------------------------------------------------------

IDS = ["c0", "c1", "m0", "m1", "b0", "zz"]
SHA = "ab" * 32
PHASE_NAMES = sorted(PHASES) + ["other"]


def _pool() -> st.SearchStrategy:
    rounds = st.integers(0, 2)
    tid = st.sampled_from(["t0", "t1", "u0", "u1"])
    chunks = st.lists(st.sampled_from(["c0", "c1"]), max_size=2, unique=True)
    return st.one_of(
        st.builds(Hello, device_id=st.just("d"), token=st.just(""), budget_bytes=st.just(1), cores=st.just(1),
                  runtimes=st.just([]), num_samples=st.just(1), resume_round=st.integers(-1, 1)),
        st.just(WELCOME),
        st.builds(Instruction, round=rounds, phase=st.sampled_from(PHASE_NAMES), model_version=st.just(0),
                  split=st.just(0), chunk_ids=chunks, model_id=st.sampled_from(["m0", "m1"]),
                  selection=st.sampled_from(sorted(SELECTIONS)), broadcast_id=st.sampled_from(["", "b0"]),
                  local_steps=st.just(1), lr=st.just(0.1), deadline_s=st.just(1.0), config=st.just({})),
        st.builds(Fetch, round=rounds, payload_id=st.sampled_from(IDS), offset=st.sampled_from([0, 4])),
        st.builds(TransferBegin, transfer_id=tid, kind=st.sampled_from(["chunk", "model", "broadcast", "update"]),
                  total_size=st.sampled_from([0, 4, 8]), sha256=st.sampled_from(["", SHA]),
                  frame_size=st.sampled_from([2, 4]), offset=st.sampled_from([0, 4]), meta=st.just({})),
        st.builds(TransferFrame, transfer_id=tid, offset=st.sampled_from([0, 2, 4, 6]),
                  data=st.binary(min_size=1, max_size=5)),
        st.builds(TransferEnd, transfer_id=tid, sha256=st.just(SHA)),
        st.builds(Report, round=rounds, phase=st.sampled_from(PHASE_NAMES), num_samples=st.just(1),
                  trained=st.just((0, 0)), transfer_id=st.sampled_from(["", "u0", "u1"]), metrics=st.just({})),
        st.builds(Ack, round=rounds, accepted=st.booleans(), reason=st.just(""),
                  phase=st.sampled_from(["", *PHASE_NAMES])),
        st.builds(Resume, transfer_id=st.sampled_from(["u0", "u1"]), offset=st.sampled_from([0, 4])),
        st.just(Error("malformed", "x")),
        st.just(Bye()),
    ).filter(lambda m: not (isinstance(m, TransferBegin) and m.offset > m.total_size))


EVENTS = st.one_of(
    st.tuples(st.sampled_from(["device.send", "device.receive", "server.send", "server.receive"]), _pool()),
    st.just(("device.next_instruction", None)),
)
_CODES = {c.value for c in ErrorCode}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix=st.booleans(), events=st.lists(EVENTS, max_size=40))
def test_random_messages_raise_nothing_but_protocol_errors_and_refusals_change_nothing(prefix, events):
    pair = Pair()
    if prefix:  # start inside a round, where most messages are at least plausible
        pair.working(instruction(0, "train", chunk_ids=("c0",)))
    sides = {"device": pair.device, "server": pair.server}
    for name, msg in events:
        side, method = name.split(".")
        session = sides[side]
        before = snapshot(session)
        try:
            getattr(session, method)(*([] if msg is None else [msg]))
        except ProtocolError as exc:
            assert exc.code in _CODES and not exc.remote
            assert snapshot(session) == before
        else:
            assert session.state in SessionState
            if session.state in (S.IDLE, S.HELLO, S.WELCOMING):
                assert session.instruction is None and session.fetch is None and session.transfer is None
            if session.state is S.WORKING:
                assert session.instruction is not None and session.round == session.instruction.round
            if isinstance(session, ServerSession) and session.state is S.IDLE:
                assert not session.pending  # the server moves on to a pending instruction by itself


# --- the reference driver: two peers over two channels, messages crossing in flight ---------------------


@dataclasses.dataclass
class Scenario:
    instructions: list[Instruction]
    payloads: dict[str, bytes]
    known: set[str]  # payloads sent with their digest first
    held: dict[str, int]  # bytes the device already holds: its fetch asks from there
    closed: set[int]  # instructions whose first fetch the server answers "round closed"
    resume: tuple[int, bytes, int] | None  # (round, update, offset the server holds)
    updates: dict[int, bytes]  # the deltas of each train instruction
    frame_size: int


@st.composite
def scenarios(draw) -> Scenario:
    count = draw(st.integers(1, 4))
    round_ = draw(st.integers(0, 3))
    resume = None
    if draw(st.booleans()):
        update = draw(st.binary(max_size=30))
        resume = (round_, update, draw(st.integers(0, len(update))))
    instructions, payloads, updates = [], {}, {}
    for i in range(count):
        round_ += draw(st.integers(0, 1)) if i else 0
        phase = draw(st.sampled_from(sorted(PHASES)))
        chunk_ids = [f"c{i}.{j}" for j in range(draw(st.integers(0, 2)))]
        broadcast = f"b{i}" if phase == "compare" or draw(st.booleans()) else ""
        instr = instruction(round_, phase, chunk_ids=chunk_ids, model_id=f"m{i}", broadcast_id=broadcast,
                            selection=draw(st.sampled_from(sorted(SELECTIONS))))
        instructions.append(instr)
        for payload_id in payload_kinds(instr):
            payloads[payload_id] = draw(st.binary(max_size=40))
        if phase == "train":
            updates[i] = draw(st.binary(max_size=40))
    ids = sorted(payloads)
    held = {pid: draw(st.integers(0, len(payloads[pid]))) if draw(st.booleans()) else 0 for pid in ids}
    closed = {i for i in range(count) if draw(st.integers(0, 4)) == 0}
    return Scenario(instructions, payloads, set(draw(st.sets(st.sampled_from(ids)))), held, closed, resume, updates,
                    draw(st.integers(1, 16)))


class Conversation:
    """A device and a server, each acting only on what it has seen, over two FIFO channels whose
    deliveries the test interleaves at random with both sides' sends."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.device, self.server = DeviceSession(), ServerSession()
        self.up: deque = deque()  # device -> server, in flight
        self.down: deque = deque()  # server -> device, in flight
        self.device_out: deque = deque()  # what each side has decided to send next
        self.server_out: deque = deque()
        self.to_instruct = deque(sc.instructions)
        self.working_on: Instruction | None = None
        self.fetched = 0
        self.reports: list[tuple[int, str]] = []
        self.closed_done: set[int] = set()
        self.ack_due = False
        self.trace: list[tuple[str, object]] = []  # every call made on either session, in order
        resume_round = sc.resume[0] if sc.resume else -1
        self.device_out.append(dataclasses.replace(HELLO, resume_round=resume_round))

    def _index(self, instr: Instruction) -> int:
        return int(instr.model_id[1:])

    def plan_device(self) -> None:
        """What the device does next, once it has sent what it decided before."""
        d = self.device
        if self.device_out or d.closed:
            return
        if d.state is S.IDLE and d.pending:
            d.next_instruction()
            self.trace.append(("device.next_instruction", None))
        if d.state is not S.WORKING or d.fetch is not None or d.transfer is not None:
            return
        instr = d.instruction
        if instr is not self.working_on:
            self.working_on, self.fetched = instr, 0
        needed = [*instr.chunk_ids, instr.model_id, *([instr.broadcast_id] if instr.broadcast_id else [])]
        if self.fetched < len(needed):
            payload_id = needed[self.fetched]
            self.fetched += 1
            self.device_out.append(Fetch(instr.round, payload_id, self.sc.held[payload_id]))
            return
        i = self._index(instr)
        if instr.phase == "train":
            transfer_id = f"u{i}"
            self.device_out.append(Report(instr.round, "train", 50, (instr.split, 4), transfer_id,
                                          {"loss_before": 1.0, "loss_after": 0.5}))
            self.device_out.extend(frames(self.sc.updates[i], transfer_id=transfer_id, kind="update", meta={},
                                          frame_size=self.sc.frame_size))
        else:
            self.device_out.append(Report(instr.round, instr.phase, 50, (0, 0), "", {"loss": 0.5}))
        self.working_on = None

    def on_server_received(self, msg) -> None:
        s, sc = self.server, self.sc
        if isinstance(msg, Hello):
            self.server_out.append(WELCOME)
            if sc.resume:
                self.server_out.append(Resume("u-old", sc.resume[2]))
        elif isinstance(msg, Fetch):
            i = self._index(s.instruction)
            if i in sc.closed and i not in self.closed_done:
                self.closed_done.add(i)
                self.server_out.append(Ack(msg.round, False, "round closed"))
            else:
                payload = sc.payloads[msg.payload_id]
                kind = next(iter(payload_kinds(s.instruction)[msg.payload_id]))
                digest = sha256_hex(payload) if msg.payload_id in sc.known else None
                self.server_out.extend(frames(payload, transfer_id=f"{msg.payload_id}-t", kind=kind, meta={},
                                              frame_size=sc.frame_size, offset=msg.offset, sha256=digest))
        elif isinstance(msg, Report):
            self.reports.append((msg.round, msg.phase))
        if s.state is S.AWAITING_ACK and not self.ack_due:
            self.ack_due = True
            phase = s.report.phase if s.report is not None else ""
            self.server_out.append(Ack(s.round, True, "", phase))

    def on_device_received(self, msg) -> None:
        if isinstance(msg, Resume):
            _, update, _ = self.sc.resume
            self.device_out.extend(frames(update, transfer_id=msg.transfer_id, kind="update", meta={},
                                          frame_size=self.sc.frame_size, offset=msg.offset))

    def actions(self) -> list[str]:
        self.plan_device()
        out = []
        if self.device_out:
            out.append("device sends")
        if self.server_out:
            out.append("server sends")
        if self.to_instruct and self.server.hello is not None:
            out.append("server instructs")
        if self.up:
            out.append("deliver up")
        if self.down:
            out.append("deliver down")
        return out

    def act(self, action: str) -> None:
        if action == "device sends":
            msg = self.device_out.popleft()
            self.device.send(msg)
            self.trace.append(("device.send", msg))
            self.up.append(msg)
        elif action == "server sends":
            msg = self.server_out.popleft()
            self.server.send(msg)
            self.trace.append(("server.send", msg))
            self.down.append(msg)
            if isinstance(msg, Ack) and msg.accepted:
                self.ack_due = False
        elif action == "server instructs":  # after anything already queued: never inside a transfer
            self.server_out.append(self.to_instruct.popleft())
        elif action == "deliver up":
            msg = self.up.popleft()
            self.server.receive(msg)
            self.trace.append(("server.receive", msg))
            self.on_server_received(msg)
        else:
            msg = self.down.popleft()
            self.device.receive(msg)
            self.trace.append(("device.receive", msg))
            self.on_device_received(msg)


def converse(sc: Scenario, data) -> Conversation:
    """Run a conversation to its end, the order of sends and deliveries drawn by hypothesis."""
    talk = Conversation(sc)
    steps = 0
    while actions := talk.actions():
        talk.act(data.draw(st.sampled_from(actions)))
        steps += 1
        assert steps < 5000
        d = talk.device
        if not talk.up and not talk.down and not (d.state is S.IDLE and d.pending):
            assert view(d) == view(talk.server)  # both have seen the same messages: they agree
    return talk


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sc=scenarios(), data=st.data())
def test_legal_conversations_are_accepted_by_both_sides_who_agree(sc, data):
    talk = converse(sc, data)
    expected = [(instr.round, instr.phase) for i, instr in enumerate(sc.instructions) if i not in sc.closed]
    assert talk.reports == expected
    for side in (talk.device, talk.server):
        assert (side.state, side.round, side.instruction, list(side.pending)) == (S.IDLE, -1, None, [])
    talk.server.send(Bye("done"))
    talk.device.receive(Bye("done"))
    assert talk.device.closed and talk.server.closed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sc=scenarios(), data=st.data())
def test_mutated_conversations_raise_nothing_but_protocol_errors(sc, data):
    """A legal conversation with calls dropped, repeated, swapped or replaced by random ones: each
    session takes or refuses every call, and a refusal changes nothing."""
    trace = converse(sc, data).trace
    replay = {"device": DeviceSession(), "server": ServerSession()}
    for name, msg in trace:  # as it was: every call is taken again
        side, method = name.split(".")
        getattr(replay[side], method)(*([] if msg is None else [msg]))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(trace)))
        op = data.draw(st.sampled_from(["drop", "repeat", "swap", "insert", "replace"]))
        if op == "insert" or i == len(trace):
            trace.insert(i, data.draw(EVENTS))
        elif op == "drop":
            del trace[i]
        elif op == "repeat":
            trace.insert(i, trace[i])
        elif op == "swap" and i + 1 < len(trace):
            trace[i], trace[i + 1] = trace[i + 1], trace[i]
        elif op == "replace":
            trace[i] = data.draw(EVENTS)
    sides = {"device": DeviceSession(), "server": ServerSession()}
    for name, msg in trace:
        side, method = name.split(".")
        session = sides[side]
        before = snapshot(session)
        try:
            getattr(session, method)(*([] if msg is None else [msg]))
        except ProtocolError as exc:
            assert exc.code in _CODES
            assert snapshot(session) == before


def test_a_training_graph_named_in_the_config_may_be_fetched() -> None:
    """A device planned on the ONNX Runtime backend fetches the graph its instruction's config names."""
    from edge_sdk.protocol import TRAIN_GRAPH_KEY, Instruction
    from edge_sdk.protocol.session import payload_kinds

    base = dict(round=1, phase="train", model_version=0, split=2, chunk_ids=["c1"], model_id="m", selection="tail",
                broadcast_id="", local_steps=1, lr=0.1, deadline_s=0.0)
    assert "train-g" not in payload_kinds(Instruction(**base, config={"seed": 1}))
    kinds = payload_kinds(Instruction(**base, config={"seed": 1, TRAIN_GRAPH_KEY: "train-g"}))
    assert kinds["train-g"] == frozenset({"train_graph"}) and kinds["m"] == frozenset({"model"})
