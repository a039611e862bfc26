"""The control frames as records: each node frame survives its trip over the wire, and every
bad frame is an ``Invalid`` that names its fault, never an exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import dicts_of
from torch_mingle._frames import (
    BEAT,
    BYE,
    Accept,
    Arrive,
    Bye,
    Close,
    Hello,
    JobClosed,
    Join,
    LeaderFrame,
    Leave,
    NodeFrame,
    Propose,
    RoundFormed,
    StatusPush,
    Wait,
    Welcome,
    from_leader,
    from_node,
)
from torch_mingle._records import Heard, History, JobEnd, Round, WaitKind
from torch_mingle._wire import FrameReader, Invalid, encode_frame

HIST = History(epoch=3, round=7, members=(0xA, 0xB, 0xC), lines=((1, 0xA, 1), (1, 0xC, 1)))
ROUND = Round(
    number=8,
    epoch=3,
    members=(0xA, 0xB),
    store_ip="198.18.0.1",
    store_port=29500,
    ips=("198.18.0.1", "198.18.0.2"),
    dports=(5000, 5001),
    pports=(0, 0),
    base=(3, 0xA, 7),
    lines=((1, 0xA, 1), (1, 0xC, 1)),
)

NODE_FRAMES: list[NodeFrame] = [
    Hello(
        node=0xB,
        epoch=3,
        leader=0xA,
        ip="198.18.0.2",
        last=(3, 7, 3),
        inc=2,
        seen=Heard(((3, 0xA, 7),)),
        ahead=True,
    ),
    Hello(node=0xB, epoch=3, leader=0xA, ip="fd00::2"),
    Join(ticket=4, ip="198.18.0.2", history=HIST, accepted=HIST, timeout_s=600.0, remaining_s=12.5),
    Join(ticket=4, ip="198.18.0.2", accepted=HIST, earlier=(HIST, HIST)),
    Join(ticket=5, ip="198.18.0.2", ref=7, dport=5001, pport=6001, gone=((0xC, (3, 0xA, 7)), (0xD, None))),
    Join(
        ticket=6,
        ip="198.18.0.2",
        place="rack1",
        restarted=True,
        seen=Heard(((3, 0xA, 9), (2, 0xC, 9))),
        timeout_s=1.0,
        remaining_s=1.0,
    ),
    Accept(8, ok=True),
    Accept(8, ok=False, history=HIST, accepted=None),
    Accept(8, ok=False, history=None, accepted=HIST, earlier=(HIST,)),
    Arrive(ticket=3, round=8, epoch=3),
    Arrive(ticket=3, round=8),  # no epoch: the leader's own term's
    Leave(),
    Leave((3, 0xA, 7)),
    Close(JobEnd("done", stops_round=True, failed=False)),
    Bye(seen=Heard(((1, 0xA, 3),))),
]


def _over_the_wire(frame: bytes) -> dict[str, Any]:
    (msg,) = dicts_of(frame)
    return msg


@pytest.mark.parametrize("frame", NODE_FRAMES, ids=lambda f: type(f).__name__)
def test_a_node_frame_reads_back_as_the_record_it_was_built_from(frame):
    assert from_node(_over_the_wire(frame.encode())) == frame
    (framed,) = FrameReader(from_node).feed(frame.encode())  # type: ignore[misc]
    assert framed.frame == frame  # what the leader's stream reads it as


def test_a_heartbeat_and_a_bye_read_as_their_one_record_from_either_side():
    for decode in (from_node, from_leader):
        assert decode(_over_the_wire(encode_frame("hb"))) is BEAT
        assert decode(_over_the_wire(encode_frame("bye"))) is BYE


def test_the_leader_frames_read_as_records():
    status = {"epoch": 3, "round": 8, "size": 2, "joined": 2, "waiting": 0, "stale": False, "closed": False}
    pushed = from_leader({"t": "status", "status": status})
    assert isinstance(pushed, StatusPush) and pushed.status is not None and pushed.status.round == 8
    assert from_leader({"t": "welcome", "epoch": 3, "status": status, "seen": [[3, "0a", 8]]}) == Welcome(
        3, pushed.status, Heard(((3, 0xA, 8),))
    )
    assert from_leader({"t": "status", "status": {"epoch": -1}}) == StatusPush(None)  # only informs
    rnd = json.loads(json.dumps(ROUND.to_json()))
    assert from_leader({"t": "propose", "round": rnd, "base": 7, "covers": [[2, "0c", 5]]}) == Propose(
        ROUND, 7, frozenset({(2, 0xC, 5)})
    )
    assert from_leader({"t": "round", "id": 4, "number": 8}) == RoundFormed(4, None, 8)
    assert from_leader({"t": "round", "id": 4, "round": rnd}) == RoundFormed(4, ROUND)
    wait = {"t": "wait", "id": 4, "reason": "r", "parked": True, "cause": "no_quorum"}
    assert from_leader(wait) == Wait(4, "r", True, cause=WaitKind.NO_QUORUM)
    assert isinstance(from_leader({**wait, "cause": "no quorum"}), Invalid)  # a kind, not a text
    assert from_leader({"t": "closed"}) == JobClosed()


@pytest.mark.parametrize(
    ("decode", "msg", "reason"),
    [
        (from_node, {"t": "hello", "node": 5, "epoch": 1, "leader": "a", "ip": "x"}, "bad hello frame"),
        (
            from_node,
            {"t": "hello", "node": "b", "epoch": 1, "leader": "a", "ip": "x", "last": {}},
            "bad hello",
        ),
        (from_node, {"t": "join", "id": True, "ip": "x"}, "bad join frame (TypeError"),
        (from_node, {"t": "join", "id": 1, "ip": "x", "gone": "all"}, "bad join frame (ValueError"),
        (from_node, {"t": "accept", "round": 1, "ok": 1}, "bad accept frame"),
        (from_node, {"t": "arrive", "id": 1, "round": 1, "epoch": "3"}, "bad arrive frame"),
        (from_node, {"t": "welcome", "epoch": 1, "status": {}}, "unexpected welcome"),
        (from_node, {"t": "nope"}, "a bad 'nope' frame"),
        (from_node, {"t": 3}, "a bad '3' frame"),
        (from_node, {}, "a bad 'None' frame"),
        (from_leader, {"t": "join", "id": 1, "ip": "x"}, "unexpected join"),
        (from_leader, {"t": "propose", "round": {}, "base": 1}, "bad propose frame"),
        (
            from_leader,
            {"t": "propose", "round": ROUND.to_json(), "base": 1, "covers": [["2", "c", 5]]},
            "bad p",
        ),
        (from_leader, {"t": "round", "id": 4}, "bad round frame (KeyError"),
        (from_leader, {"t": "closed", "id": float("inf")}, "bad closed frame"),
        (from_leader, {"t": "next", "port": 0}, "bad next frame"),
        (from_leader, {"t": "bye", "gone": "everyone"}, "bad bye frame"),
        (from_leader, {"t": "status", "status": []}, "bad status frame"),
    ],
)
def test_a_bad_frame_is_invalid_and_says_why(decode, msg, reason):
    got = decode(msg)
    assert isinstance(got, Invalid) and got.reason.startswith(reason), got


def test_fields_that_only_inform_fall_back_to_unknown():
    join = {"t": "join", "id": 1, "ip": "not an ip", "timeout_s": -3, "dport": 70000, "place": "x" * 999}
    assert from_node({**join, "seen": -1}) == Join(ticket=1, ip="?")
    assert from_node({"t": "leave", "left": "garbage"}) == Leave(None)  # it keeps its vote
    assert from_node({"t": "close", "why": 5, "failed": "yes"}) == Close()
    hello = {"t": "hello", "node": "b", "epoch": 1, "leader": "a", "ip": "198.18.0.2", "inc": -4}
    assert from_node(hello) == Hello(0xB, 1, 0xA, "198.18.0.2", inc=1)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_KINDS = ["hello", "join", "accept", "arrive", "leave", "close", "bye", "hb", "welcome", "reject", "propose"]
_KINDS += ["members", "round", "wait", "retry", "timeout", "closed", "status", "ack", "evicted", "next", "x"]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(_KINDS), st.dictionaries(st.sampled_from(_FIELDS := ["id", "ip", "round", "ok",
       "epoch", "status", "why", "reason", "parked", "port", "gone", "history", "accepted", "ref", "node",
       "leader", "last", "base", "covers", "number", "left", "seen", "inc"]), _JSON, max_size=8))  # fmt: skip
def test_any_json_object_reads_as_a_record_or_invalid_never_an_exception(kind, fields):
    msg = {**fields, "t": kind}
    assert isinstance(from_node(msg), NodeFrame | Invalid)
    assert isinstance(from_leader(msg), LeaderFrame | Invalid)


def test_the_lines_of_a_round_and_of_a_history_travel_with_them():
    """``lines`` (which lines of the job a round continues) is not part of a history's equality;
    it travels all the same, and a bad one makes the frame invalid."""
    frame = from_node(_over_the_wire(Join(ticket=4, ip="198.18.0.2", history=HIST).encode()))
    assert isinstance(frame, Join) and frame.history is not None and frame.history.lines == HIST.lines
    bad = {"t": "join", "id": 4, "ip": "198.18.0.2", "history": {**HIST.to_json(), "lines": [[1, "0", 1]]}}
    assert isinstance(from_node(bad), Invalid)
