"""The follower's session, sans I/O: what it sends when, and what it keeps from the leader's frames."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import dicts_of, leader_said, leader_sent, node_said, node_sent
from torch_mingle._claims import Claim
from torch_mingle._follower import FollowerSession, SessionOver
from torch_mingle._frames import Join, Propose, RoundFormed
from torch_mingle._jobs import OpenStore
from torch_mingle._leader import LeaderTerm
from torch_mingle._records import History, Round, Status
from torch_mingle._rounds import RoundBook
from torch_mingle._settings import Beats, RoundRules
from torch_mingle._wire import Seal, derive_key

LEADER = 0x1


def _session_to(claim: Claim) -> FollowerSession:
    return FollowerSession(
        claim=claim, ip="198.18.0.1", port=4000, node=0x2, own_ip="198.18.0.2", history=None,
        beats=Beats(interval_s=1.0, timeout_s=3.0, connect_timeout_s=3.0), label="", started=0.0,
    )  # fmt: skip


def _ready_session() -> FollowerSession:
    s = _session_to(Claim(1, LEADER))
    s.connected(0.1)
    s.received(leader_said([{"t": "welcome", "epoch": 1, "status": Status().to_json()}]), 0.2)
    assert s.ready, s.events()
    return s


def test_a_retry_keeps_the_store_named_for_the_next_round():
    """The leader names each store once per node: a node that forgot it would connect late."""
    s = _ready_session()
    s.received(leader_said([{"t": "next", "port": 5001}]), 0.3)
    s.received(
        leader_said([{"t": "retry", "id": 7, "why": "superseded by a newer join of the same node"}]), 0.4
    )
    assert s.next_store_port == 5001
    s.received(leader_said([{"t": "timeout", "id": 8, "why": "join_timeout"}]), 0.5)
    assert s.next_store_port == 5001


def test_a_node_that_gives_up_on_its_leader_still_says_bye_before_it_closes():
    """Closed without a bye, the connection would tell the leader this node's process is gone,
    and the leader would stop counting its vote while it is alive (on the other side)."""
    s = _ready_session()
    s.handle_timer(10.0)  # no heartbeat for 3 s: the session ends by this node's own decision
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason == "no heartbeat from the leader for 3s"
    assert s.bye() is not None
    s.closed("reset", now=10.1)
    assert s.bye() is None  # the other end closed it: nothing left to say


def test_bytes_that_complete_no_frame_do_not_keep_the_leader_alive():
    """Only a whole frame (with a secret, one whose MAC checked) shows the leader alive: a frame
    header and a byte now and then would keep a dead leader "alive" for as long as its announced
    size lasts, unauthenticated; and a frozen leader's kernel still drains its send buffer."""
    s = _ready_session()  # last whole frame at 0.2; bound 3 s
    for t in (1.0, 2.0, 3.0):
        s.received(leader_said([]), t)
    s.handle_timer(3.2)
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason == "no heartbeat from the leader for 3s"


def test_a_leaving_leaders_bye_makes_it_and_the_members_it_knew_gone():
    s = _ready_session()
    gone = ["00000000000000aa", ["00000000000000bb", 2, "0000000000000001", 7]]
    s.received(leader_said([{"t": "bye", "leaving": True, "gone": gone}]), 0.3)
    s.closed("closed by the peer", now=0.4)
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason == "the leader 198.18.0.1:4000 said bye: it leaves"
    # Each with the round it left (epoch, leader, number); a bare id: a round not known.
    assert s.leader_reported_gone == ((0xAA, None), (0xBB, (2, 1, 7)))


def test_a_leader_that_steps_down_alive_is_not_gone():
    s = _ready_session()
    s.received(leader_said([{"t": "bye", "leaving": False, "gone": []}]), 0.3)
    s.closed("closed by the peer", now=0.4)
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason == "the leader 198.18.0.1:4000 said bye: it no longer leads"
    assert s.leader_reported_gone == ()  # its term is over; it votes


@pytest.mark.parametrize("leaving", [True, False])
def test_a_bye_before_the_welcome_is_the_leader_leaving_not_a_protocol_error(leaving):
    """A leader that shuts down or steps down says bye to every connection, also to one whose
    hello it has not answered yet: that node must read it as the leader leaving (or alive and
    stepped down), not as a broken leader."""
    s = _session_to(Claim(1, LEADER))
    s.connected(0.1)
    s.received(leader_said([{"t": "bye", "leaving": leaving, "gone": ["00000000000000aa"]}]), 0.2)
    assert not [e for e in s.events() if isinstance(e, SessionOver)]  # the close ends it
    s.closed("closed by the peer", now=0.3)
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason.endswith("said bye: " + ("it leaves" if leaving else "it no longer leads"))
    assert s.leader_reported_gone == ((0xAA, None),)


def test_an_accepted_hello_waits_the_heartbeat_timeout_for_its_welcome_not_the_connect_timeout():
    """A new leader that welcomes a thousand nodes at once answers late: a node whose
    connection it accepted gives it the heartbeat timeout (3 s here), not the 1 s connect
    timeout, and only then loses it by silence."""
    s = FollowerSession(
        claim=Claim(1, LEADER), ip="198.18.0.1", port=4000, node=0x2, own_ip="198.18.0.2", history=None,
        beats=Beats(interval_s=1.0, timeout_s=3.0, connect_timeout_s=1.0), label="", started=0.0,
    )  # fmt: skip
    s.connected(0.5)
    assert s.next_timer() == 3.5
    s.handle_timer(2.0)  # past the connect timeout: still waiting
    assert not s.over
    s.received(leader_said([{"t": "welcome", "epoch": 1, "status": Status().to_json()}]), 3.4)
    assert s.ready
    late = FollowerSession(
        claim=Claim(1, LEADER), ip="198.18.0.1", port=4000, node=0x3, own_ip="198.18.0.3", history=None,
        beats=Beats(interval_s=1.0, timeout_s=3.0, connect_timeout_s=1.0), label="", started=0.0,
    )  # fmt: skip
    late.handle_timer(0.9)
    assert not late.over
    late.handle_timer(1.0)  # never accepted: lost at the connect timeout
    (over,) = [e for e in late.events() if isinstance(e, SessionOver)]
    assert "did not accept our connection within 1s" in over.reason
    silent = FollowerSession(
        claim=Claim(1, LEADER), ip="198.18.0.1", port=4000, node=0x4, own_ip="198.18.0.4", history=None,
        beats=Beats(interval_s=1.0, timeout_s=3.0, connect_timeout_s=1.0), label="", started=0.0,
    )  # fmt: skip
    silent.connected(0.5)
    silent.handle_timer(3.5)
    (over,) = [e for e in silent.events() if isinstance(e, SessionOver)]
    assert "did not answer our hello within 3s" in over.reason


def _frames(data: list[bytes]) -> list[dict[str, Any]]:
    """What was sent, as JSON objects (to look at)."""
    return [msg for chunk in data for msg in dicts_of(chunk)]


def _leader_of_two(epoch: int) -> LeaderTerm:
    book = RoundBook(leader=LEADER, epoch=epoch, rules=RoundRules(2, 2, 1.0))
    term = LeaderTerm(
        claim=Claim(epoch, LEADER), book=book, advertised_ip="198.18.0.1", beats=Beats(1.0, 3.0),
        label="",
    )  # fmt: skip
    term.start(0.0)
    term.job_done(OpenStore(), 5001, None, 0.0)
    term.join_local(Join(1, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.0)
    term.frames()
    return term


def test_a_join_asked_before_the_connection_is_up_goes_out_with_the_hello_and_gets_its_round():
    """The last node to start joins as it connects: hello and join leave together, and the
    leader (which reads them in order) answers welcome and its proposal in one go, a round trip
    less; the round follows the votes."""
    s = _session_to(Claim(1, LEADER))
    s.join(Join(7, "198.18.0.2", timeout_s=60.0, remaining_s=60.0))
    assert s.frames() == []  # not connected yet
    s.connected(0.1)
    sent = _frames(s.frames())
    assert [f["t"] for f in sent] == ["hello", "join"]
    term = _leader_of_two(1)
    term.accepted(10, 0.1)
    term.received(10, node_said(sent), 0.1)
    answers = _frames([frame for conn, frame in term.frames() if conn == 10])
    assert [f["t"] for f in answers if f["t"] in ("welcome", "propose")] == ["welcome", "propose"]
    s.received(leader_said(answers), 0.2)
    (proposed,) = [e for e in s.events() if isinstance(e, Propose)]
    s.accept(proposed.round.number)  # the node records the proposal, then votes for it
    term.received(10, node_sent(s.frames()), 0.2)
    for local in term.local():  # and so does the leader's own node
        if isinstance(local, Propose):
            term.accept_local(local.round.number, 0.2)
    s.received(leader_sent([frame for conn, frame in term.frames() if conn == 10]), 0.3)
    (answer,) = [e for e in s.events() if isinstance(e, RoundFormed)]
    assert answer.ticket == 7 and answer.round == proposed.round


def test_a_join_asked_while_the_hello_is_unanswered_is_sent_at_once():
    s = _session_to(Claim(1, LEADER))
    s.connected(0.1)
    s.frames()
    s.join(Join(8, "198.18.0.2", timeout_s=60.0, remaining_s=60.0))
    assert [f["t"] for f in _frames(s.frames())] == ["join"]


def test_a_join_behind_a_rejected_hello_is_dropped_by_the_leader_and_the_session_ends():
    """A stale announcement: the node's join never reaches a round of the wrong term."""
    s = _session_to(Claim(1, LEADER))
    s.join(Join(7, "198.18.0.2", timeout_s=60.0, remaining_s=60.0))
    s.connected(0.1)
    term = _leader_of_two(2)  # leads epoch 2, not the epoch-1 claim the node follows
    term.accepted(10, 0.1)
    term.received(10, node_sent(s.frames()), 0.1)
    answers = _frames([frame for conn, frame in term.frames() if conn == 10])
    assert [f["t"] for f in answers] == ["reject"]
    assert term.book.pending.keys() == {LEADER}
    s.received(leader_said(answers), 0.2)
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason.startswith("the leader rejected us")  # it leads another claim


def test_a_node_that_leaves_before_its_connection_is_up_sends_its_leave_and_no_join():
    """Its agent's join was answered by the leave: a join sent behind the leave would undo it."""
    s = _session_to(Claim(1, LEADER))
    s.join(Join(7, "198.18.0.2", timeout_s=60.0, remaining_s=60.0))
    s.leave()
    s.connected(0.1)
    assert [f["t"] for f in _frames(s.frames())] == ["hello", "leave"]


def test_a_round_carries_the_status_it_starts_under_and_no_status_frame_follows_it():
    """As a round starts, each member reads one frame: the round, with what ``num_nodes_waiting``
    needs; a status frame behind it cost every member a second read and wake-up."""
    s = _session_to(Claim(1, LEADER))
    s.join(Join(7, "198.18.0.2", timeout_s=60.0, remaining_s=60.0))
    s.connected(0.1)
    term = _leader_of_two(1)
    term.accepted(10, 0.1)
    term.received(10, node_sent(s.frames()), 0.1)
    s.received(leader_sent([frame for conn, frame in term.frames() if conn == 10]), 0.15)
    (proposed,) = [e for e in s.events() if isinstance(e, Propose)]
    s.accept(proposed.round.number)
    term.received(10, node_sent(s.frames()), 0.15)
    for local in term.local():
        if isinstance(local, Propose):
            term.accept_local(local.round.number, 0.15)
    answers = _frames([frame for conn, frame in term.frames() if conn == 10])
    assert [f["t"] for f in answers if f["t"] in ("round", "status")] == ["round"]
    s.received(leader_said(answers), 0.2)
    assert s.status is not None and (s.status.epoch, s.status.round, s.status.size) == (1, 1, 2)
    term.handle_timer(0.5)
    later = _frames([frame for conn, frame in term.frames() if conn == 10])
    assert "status" not in [f["t"] for f in later]


def _join_sent(s: FollowerSession, history: History | None) -> dict[str, Any]:
    s.frames()  # the hello
    s.join(Join(2, "198.18.0.2", history=history, timeout_s=60.0, remaining_s=60.0))
    (frame,) = s.frames()
    (msg,) = dicts_of(frame)
    return msg


def test_a_join_names_a_round_this_leader_delivered_by_its_number_and_others_in_full():
    """Sending N ids back with every join made a re-rendezvous O(N**2) bytes for the leader."""
    s = _ready_session()
    rnd = Round(number=4, epoch=1, members=(LEADER, 0x2, 0x3), store_ip="198.18.0.1", store_port=5001)
    assert _join_sent(s, History.of(rnd))["history"] is not None  # not delivered on this connection
    s.received(leader_said([{"t": "round", "id": 1, "round": rnd.to_json()}]), 0.3)
    msg = _join_sent(s, History.of(rnd))
    assert (msg["ref"], msg["history"]) == (4, None)
    other_term = Round(number=4, epoch=1, members=(0x3, LEADER, 0x2), store_ip="198.18.0.3", store_port=5001)
    msg = _join_sent(s, History.of(other_term))  # the same number, led by another node
    assert (msg["ref"], msg["history"]["round"]) == (None, 4)


@pytest.mark.parametrize("secret", [None, b"s" * 16], ids=["plain", "sealed"])
def test_a_round_formed_without_votes_goes_once_as_members_and_each_answer_names_it(secret):
    """A round that needs no votes (here ``quorum=none``): the leader encodes its members once,
    every member gets those same bytes (sealed per connection with a secret), then an answer
    that names the round by number; a frame of N members built per member was O(N**2)."""
    key = derive_key(secret) if secret else None
    book = RoundBook(
        leader=LEADER,
        epoch=1,
        rules=RoundRules(3, 3, 1.0, quorum=False),
    )
    term = LeaderTerm(
        claim=Claim(1, LEADER), book=book, advertised_ip="198.18.0.1", beats=Beats(1.0, 3.0),
        label="", seal_key=key,
    )  # fmt: skip
    term.start(0.0)
    term.job_done(OpenStore(), 5001, None, 0.0)
    term.join_local(Join(1, "198.18.0.1", timeout_s=60.0, remaining_s=60.0), 0.0)
    sessions = {}
    for conn, node in ((10, 0x2), (11, 0x3)):
        s = _session_to(Claim(1, LEADER))
        s.node, s.conn, s.seal = node, conn, Seal(key, leader=False) if key else None
        s.join(Join(7, f"198.18.0.{node}", timeout_s=60.0, remaining_s=60.0))
        term.accepted(conn, 0.1)
        s.connected(0.1)
        sessions[conn] = s
    members_frames = []
    for _ in range(4):  # challenge, hello and join, welcome and the round
        for conn, frame in term.frames():
            frames = _frames([frame])
            members_frames += [frame for f in frames if f["t"] == "members"]
            sessions[conn].received(leader_sent([frame]), 0.2)
        for conn, s in sessions.items():
            term.received(conn, node_sent(s.frames()), 0.2)
    assert len(members_frames) == 2
    if key is None:
        assert members_frames[0] is members_frames[1]  # the same bytes, not built twice
    for s in sessions.values():
        (answer,) = [e for e in s.events() if isinstance(e, RoundFormed)]
        assert answer.round == term.book.current


@pytest.mark.parametrize(
    ("before_welcome", "frame"),
    [
        (True, {"t": "bye", "leaving": True, "gone": [["not an id"]]}),
        (True, {"t": "bye", "leaving": False, "gone": "everyone"}),
        (False, b'{"t":"closed","id":1e400,"why":"x"}'),  # a number JSON reads as infinity
    ],
)
def test_a_bad_field_from_the_leader_ends_the_session_as_its_protocol_error(before_welcome, frame):
    """Not an exception out of the session (an internal error of the node's loop)."""
    if before_welcome:
        s = _session_to(Claim(1, LEADER))
        s.connected(0.1)
    else:
        s = _ready_session()
    s.received(leader_said([frame]), 0.3)
    (over,) = [e for e in s.events() if isinstance(e, SessionOver)]
    assert over.reason.startswith("protocol error from the leader: bad ")


def _beats(s: FollowerSession) -> list[dict[str, Any]]:
    frames = [f for raw in s.frames() for f in dicts_of(raw)]
    return [f for f in frames if f["t"] == "hb"]


def test_a_round_of_another_term_heard_of_goes_to_the_leader_at_once_and_once():
    """Seed 50005902: a node heard of another side's first round after its join went out; it
    tells its leader at once, in a beat, before it sends anything else (its vote too)."""
    from torch_mingle._records import NOTHING_HEARD

    s = _ready_session()
    s.frames()
    own = NOTHING_HEARD.with_keys((1, LEADER, 3))
    s.tell(own)  # its own leader's round: the leader knows it
    assert _beats(s) == []
    other = own.with_keys((2, 0xB, 1))
    s.tell(other)
    assert [b.get("seen") for b in _beats(s)] == [[[1, f"{LEADER:016x}", 3], [2, f"{0xB:016x}", 1]]]
    s.tell(other)  # told already
    assert _beats(s) == []


def test_before_the_hello_the_hello_tells_what_the_node_heard():
    from torch_mingle._records import NOTHING_HEARD

    s = _session_to(Claim(1, LEADER))
    s.tell(NOTHING_HEARD.with_keys((2, 0xB, 1)))
    s.connected(0.1)
    hello = [f for raw in s.frames() for f in dicts_of(raw) if f["t"] == "hello"]
    assert hello and hello[0]["seen"] == [[2, f"{0xB:016x}", 1]]
