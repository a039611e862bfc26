"""The control frames as typed records: what a node and its leader may say to each other.

``_wire`` carries a control connection's bytes (``FrameReader``: a length, then a JSON object
with a type ``t``; ``Seal``: the MAC of every frame). This module is the other half of the
boundary: ``from_node`` and ``from_leader_stream`` (the ``decode`` of a stream's reader, so
that a frame leaves the reader as its record: ``_wire.Framed``) turn each JSON object into
one frozen record of the kinds its sender may send, or an ``Invalid`` that names what is
wrong with it, so that no dict and no optional field is read past this point. A field whose
value only informs (``timeout_s``, ``dport``, ``place``, ``seen``...) falls back to
"unknown" when it is bad, as an older node may send it without; a field the protocol
decides on (a round, a history, a ``gone`` list, an id) makes the frame invalid, and the
receiver ends the connection as the peer's protocol error.

The node's frames are also built here (``encode``), so that one record says what a join or
a hello carries on both sides. Why a module of its own and not ``_wire``: the records hold
``_rounds``' values (``Round``, ``History``, ``Status``), and ``_rounds`` builds on ``_wire``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, cast

from torch_mingle._keys import RoundKey
from torch_mingle._places import MAX_PLACE_CHARS
from torch_mingle._record import record
from torch_mingle._records import (
    MAX_EPOCH,
    MAX_HEARD,
    MAX_MEMBERS,
    MAX_ROUND,
    NOTHING_HEARD,
    Gone,
    Heard,
    History,
    JobEnd,
    Round,
    Status,
    WaitKind,
    bounded_int,
    gone_of,
    gone_to_json,
    node_hex,
    node_id,
    peer_ip,
    round_key_of,
    round_key_to_json,
)
from torch_mingle._settings import Difference, Terms
from torch_mingle._wire import Framed, Invalid, Seal, encode_frame

#: A join's wait, as its node says it, is at least this long (a shorter one is a busy loop).
MIN_JOIN_WAIT_S = 0.5
#: The longest text of a peer's reason that is kept (a job's close, a reject).
MAX_WHY_CHARS = 2000


class OutOfContext(Exception):
    """A well-formed frame that names what its connection never saw (a join whose ``ref`` is a
    round not answered on it): the peer's protocol error, found where the context is known.
    Only this is blamed on the peer past the boundary: any other exception is an internal
    error of the receiver, which its shell's supervision handles (``Node.recover``)."""


#: What reading a peer's field may raise; the frame is then invalid.
_BAD_FIELD = (KeyError, TypeError, ValueError, OverflowError, AttributeError, IndexError)


# --------------------------------------------------------------------------- node -> leader


@record
class Hello:
    """The node's first frame (after the seal's challenge): who it is and whom it follows."""

    node: int
    epoch: int
    leader: int
    ip: str
    #: (epoch, round, size) of the node's last round: the leader counts its support by it.
    last: tuple[int, int, int] | None = None
    #: Which process of its node id (``_identity``): a newer one replaces an older one.
    inc: int = 1
    #: The highest round the node heard of.
    seen: Heard = NOTHING_HEARD
    #: The node connects to the next round's store ahead: the leader names it (``Next``).
    ahead: bool = False
    #: What must agree across the job (``_settings.Terms``); the leader refuses a node whose differ.
    terms: Terms = ()
    #: Not a node: ``torch-mingle status``, which the leader answers with a ``View`` and closes.
    observe: bool = False

    def fields(self) -> dict[str, Any]:
        last = self.last
        return {
            "node": node_hex(self.node),
            "epoch": self.epoch,
            "leader": node_hex(self.leader),
            "ip": self.ip,
            "last": {"epoch": last[0], "round": last[1], "size": last[2]} if last else None,
            "inc": self.inc,
            "seen": self.seen.to_json(),
            "ahead": self.ahead,
            "terms": dict(self.terms) or None,
            "observe": self.observe or None,
        }

    def encode(self) -> bytes:
        return encode_frame("hello", **self.fields())


@record
class Join:
    """Ask for a place in the next round (``_rounds.JoinRequest`` is what the leader makes of it);
    ``ticket`` names the ask, the answer names it back."""

    ticket: int
    ip: str
    #: The node's last round, sent whole, or (``ref``) by the number of a round the leader
    #: answered on this connection: the leader holds its members.
    history: History | None = None
    ref: int | None = None
    accepted: History | None = None
    #: The votes of other terms its later ones replaced, that may still have formed (``Ballot.earlier``).
    earlier: tuple[History, ...] = ()
    #: The agent's ``join_timeout`` and what is left of it (0: none said).
    timeout_s: float = 0.0
    remaining_s: float = 0.0
    dport: int = 0
    pport: int = 0
    gone: Gone = ()
    place: str = ""
    restarted: bool = False
    seen: Heard = NOTHING_HEARD

    def encode(self) -> bytes:
        return encode_frame(
            "join",
            id=self.ticket,
            ip=self.ip,
            dport=self.dport,
            pport=self.pport,
            gone=gone_to_json(self.gone),
            history=self.history.to_json() if self.history and self.ref is None else None,
            ref=self.ref,
            accepted=self.accepted.to_json() if self.accepted else None,
            earlier=[h.to_json() for h in self.earlier] or None,
            place=self.place or None,
            restarted=self.restarted or None,
            seen=self.seen.to_json(),
            timeout_s=self.timeout_s,
            remaining_s=self.remaining_s,
        )


@record
class Accept:
    """The node's answer to proposal ``round``: recorded (``ok``), or refused with what it knows."""

    round: int
    ok: bool
    history: History | None = None
    accepted: History | None = None
    earlier: tuple[History, ...] = ()

    def encode(self) -> bytes:
        if self.ok:
            return encode_frame("accept", round=self.round, ok=True)
        return encode_frame(
            "accept",
            round=self.round,
            ok=False,
            history=self.history.to_json() if self.history else None,
            accepted=self.accepted.to_json() if self.accepted else None,
            earlier=[h.to_json() for h in self.earlier] or None,
        )


@record
class Arrive:
    """The node's workers reached round ``round`` of ``epoch`` (None: the leader's own)."""

    ticket: int
    round: int
    epoch: int | None = None

    def encode(self) -> bytes:
        if self.epoch is None:
            return encode_frame("arrive", id=self.ticket, round=self.round)
        return encode_frame("arrive", id=self.ticket, round=self.round, epoch=self.epoch)


@record
class Leave:
    """The node leaves the job; ``left``: the newest round it was in or voted for (None: unknown)."""

    left: RoundKey | None = None

    def encode(self) -> bytes:
        if self.left is None:
            return encode_frame("leave")
        return encode_frame("leave", left=round_key_to_json(self.left))


@record
class Close:
    """The node closes the job, and says how it ends (on the wire: ``failed``, a round cannot
    start; ``job_failed``, the job failed)."""

    end: JobEnd = JobEnd()

    def encode(self) -> bytes:
        end = self.end
        return encode_frame("close", why=end.why, failed=end.stops_round, job_failed=end.failed)


# --------------------------------------------------------------------------- both ways


@record
class Beat:
    """A heartbeat; from a node, ``seen``: rounds of the job it heard of since it last told its
    leader, sent at once (``FollowerSession.tell``)."""

    seen: Heard = NOTHING_HEARD

    def encode(self) -> bytes:
        return encode_frame("hb", seen=self.seen.to_json()) if self.seen else encode_frame("hb")


@record
class Bye:
    """The sender closes this connection itself, alive (not a death). From the leader:
    ``leaving`` (it leaves the job, else it no longer leads) and the nodes it knows left; from
    a node: the highest round of the job it heard of (``seen``: it may go to a leader whose
    job ran, and the leader it leaves must then found no job alone, ``OtherTerms.unaccounted``)."""

    leaving: bool = False
    gone: Gone = ()
    seen: Heard = NOTHING_HEARD

    def encode(self) -> bytes:
        fields: dict[str, Any] = {}
        if self.leaving or self.gone:  # the leader's
            fields.update(leaving=self.leaving, gone=gone_to_json(self.gone))
        if self.seen:  # a node's
            fields.update(seen=self.seen.to_json())
        return encode_frame("bye", **fields)


BEAT = Beat()
BYE = Bye()


# --------------------------------------------------------------------------- leader -> node


@record
class Welcome:
    epoch: int
    status: Status | None = None
    seen: Heard = NOTHING_HEARD

    def encode(self) -> bytes:
        status = self.status.to_json() if self.status is not None else None
        return encode_frame("welcome", epoch=self.epoch, status=status, seen=self.seen.to_json())


@record
class Reject:
    why: str

    def encode(self) -> bytes:
        return encode_frame("reject", why=self.why)


@record
class View:
    """The leader's answer to an observer (``_jobview.job_view``)."""

    view: dict[str, Any]

    def encode(self) -> bytes:
        return encode_frame("view", view=self.view)


@record
class Mismatch:
    """The node's settings differ from the job's (its leader's): it is refused for good."""

    diffs: tuple[Difference, ...]

    def encode(self) -> bytes:
        return encode_frame("mismatch", diffs=[list(d) for d in self.diffs])


@record
class Propose:
    """A round the leader proposes; ``base``: the round it builds on, ``covers``: the proposals
    and rounds of other terms it accounts for (``Form.covers``), as (epoch, leader, round)."""

    round: Round
    base: int
    covers: frozenset[RoundKey] = frozenset()

    def encode(self) -> bytes:
        """The same bytes for every voter: the round's member list is encoded once (``Round.encoded``)."""
        covers = [[e, node_hex(leader), r] for e, leader, r in sorted(self.covers)]
        return encode_frame("propose", base=self.base, covers=covers, encoded={"round": self.round.encoded})


@record
class Members:
    """A formed round, sent before the answers that name it by number."""

    round: Round

    def encode(self) -> bytes:
        return encode_frame("members", encoded={"round": self.round.encoded})


@record
class RoundFormed:
    """The answer to join ``ticket``: the round itself, or (on the wire) the number of one the
    node got before as a proposal or ``members``; its session puts the round in its place."""

    ticket: int
    round: Round | None = None
    number: int | None = None
    #: The status the round runs under.
    status: Status | None = None

    def encode(self, status_text: str | None = None) -> bytes:
        """By number (the leader's answer: the member holds the round, proposed or ``members``);
        ``status_text``: the status encoded once for every member it goes to."""
        if self.number is None:
            raise ValueError("a round is answered by its number")
        encoded = {"status": status_text} if status_text is not None else {}
        return encode_frame("round", id=self.ticket, number=self.number, encoded=encoded)


@record
class Wait:
    """Join ``ticket`` waits (``parked``: as a spare of a running round); ``seen``: the highest
    round the leader knows of."""

    ticket: int
    reason: str
    parked: bool = False
    seen: Heard = NOTHING_HEARD
    #: Why, for the node to decide on (``reason`` says it for people).
    cause: WaitKind = WaitKind.FIRST_JOIN

    def encode(self) -> bytes:
        return encode_frame(
            "wait",
            id=self.ticket,
            reason=self.reason,
            parked=self.parked,
            seen=self.seen.to_json(),
            cause=self.cause.value,
        )


@record
class Retry:
    """Join ``ticket`` must be asked again (the round it would have been in broke)."""

    ticket: int
    why: str

    def encode(self) -> bytes:
        return encode_frame("retry", id=self.ticket, why=self.why)


@record
class JoinTimedOut:
    """Join ``ticket`` waited its whole timeout."""

    ticket: int
    why: str

    def encode(self) -> bytes:
        return encode_frame("timeout", id=self.ticket, why=self.why)


@record
class JobClosed:
    """The job is closed (the answer to join ``ticket``, 0: to none), and how it ended (on the
    wire: its ``why``, and whether it ``failed``)."""

    ticket: int = 0
    end: JobEnd = JobEnd()

    def encode(self) -> bytes:
        return encode_frame("closed", id=self.ticket, why=self.end.why, failed=self.end.failed)


#: What a join is answered, by the leader's session or by the leader's own term.
JoinAnswer = RoundFormed | Wait | Retry | JoinTimedOut | JobClosed


@record
class StatusPush:
    status: Status | None

    def encode(self) -> bytes:
        return encode_frame("status", status=self.status.to_json() if self.status is not None else None)


@record
class Ack:
    """The answer to arrive ``ticket``."""

    ticket: int

    def encode(self) -> bytes:
        return encode_frame("ack", id=self.ticket)


@record
class Evicted:
    """The leader declared this node dead (or another connection took its id)."""

    why: str

    def encode(self) -> bytes:
        return encode_frame("evicted", why=self.why)


@record
class Next:
    """The port of the next round's store, for a node that connects to it ahead."""

    port: int

    def encode(self) -> bytes:
        return encode_frame("next", port=self.port)


@record
class Challenge:
    """With a secret, the leader's first frame: its nonce, which the node's hello answers
    (``Seal.hello``)."""

    nonce: str


@record
class Unsealed:
    """A frame without its connection's MAC (with a secret): it ends the connection."""


UNSEALED = Unsealed()

NodeFrame = Hello | Join | Accept | Arrive | Leave | Close | Beat | Bye
LeaderFrame = (
    Welcome | Reject | Mismatch | Propose | Members | RoundFormed | Wait | Retry | JoinTimedOut | JobClosed
    | StatusPush | Ack | Evicted | Next | Beat | Bye | View
)  # fmt: skip


def node_frames(batch: list[Framed], seal: Seal | None) -> Iterator[NodeFrame | Invalid | Unsealed]:
    """A node's frames on one connection, in order (read by ``from_node``). With a secret each
    is checked against the connection's seal first (the hello against the leader's
    challenge), and the first that fails is ``UNSEALED``, after which nothing of this batch is
    opened. Lazily: a frame that ends the connection leaves the rest unopened, and the seal's
    count with them."""
    for framed in batch:
        if seal is not None and not (seal.open(framed) if seal.ready else seal.check_hello(framed)):
            yield UNSEALED
            return
        yield cast("NodeFrame | Invalid", framed.frame)


def leader_frames(
    batch: list[Framed], seal: Seal | None
) -> Iterator[LeaderFrame | Challenge | Invalid | Unsealed]:
    """A leader's frames on one connection, in order (read by ``from_leader_stream``): with a
    secret, once the handshake is done, each checked against the connection's seal
    (``UNSEALED`` ends the batch); before it, the leader's ``Challenge``. A challenge at any
    other time is a frame no node receives."""
    for framed in batch:
        if seal is not None and seal.ready and not seal.open(framed):
            yield UNSEALED
            return
        frame = cast("LeaderFrame | Challenge | Invalid", framed.frame)
        if (isinstance(frame, Challenge) or frame is BAD_CHALLENGE) and (seal is None or seal.ready):
            frame = _CHALLENGE_OUT_OF_TURN
        yield frame


# --------------------------------------------------------------------------- decoding


def from_node(msg: dict[str, Any]) -> NodeFrame | Invalid:
    """A node's frame as its record, or ``Invalid`` saying what is wrong with it."""
    frame: NodeFrame | Invalid = _decode(msg, _FROM_NODE, "leader")
    return frame


def from_leader(msg: dict[str, Any]) -> LeaderFrame | Invalid:
    """A leader's frame as its record, or ``Invalid`` saying what is wrong with it."""
    frame: LeaderFrame | Invalid = _decode(msg, _FROM_LEADER, "node")
    return frame


def from_leader_stream(msg: dict[str, Any]) -> LeaderFrame | Challenge | Invalid:
    """What a connection to the leader carries (``FrameReader``'s ``decode`` there): the
    leader's frames (``from_leader``), and its ``Challenge`` (which only opens a connection
    with a secret: ``leader_frames``)."""
    if msg.get("t") == "challenge":
        return Challenge(_text(msg["n"])) if isinstance(msg.get("n"), str) else BAD_CHALLENGE
    return from_leader(msg)


#: A challenge whose nonce is not a text.
BAD_CHALLENGE = Invalid("a bad challenge")


def _decode(msg: dict[str, Any], parsers: dict[str, Callable[[dict[str, Any]], Any]], to: str) -> Any:
    kind = msg.get("t")
    if kind == "hb":
        return Beat(seen=Heard.of(msg["seen"])) if "seen" in msg else BEAT
    parse = parsers.get(kind) if isinstance(kind, str) else None
    if parse is None:
        if isinstance(kind, str) and kind in _KINDS:
            return Invalid(f"unexpected {kind} (a frame that no {to} receives)")
        return Invalid(f"a bad {str(kind)[:20]!r} frame")
    try:
        return parse(msg)
    except _BAD_FIELD as exc:
        return Invalid(f"bad {kind} frame ({type(exc).__name__}: {str(exc)[:80]})")


def _hello(m: dict[str, Any]) -> Hello:
    raw_last = m.get("last")
    last = None
    if raw_last is not None:
        last = (
            bounded_int(raw_last["epoch"], MAX_EPOCH),
            bounded_int(raw_last["round"], MAX_ROUND),
            bounded_int(raw_last["size"], MAX_MEMBERS, 1),
        )
    inc = m.get("inc")
    return Hello(
        node=node_id(m["node"]),
        epoch=bounded_int(m["epoch"], MAX_EPOCH),
        leader=node_id(m["leader"]),
        ip=_ip(m["ip"]),
        last=last,
        inc=inc if isinstance(inc, int) and not isinstance(inc, bool) and inc > 0 else 1,
        seen=Heard.of(m.get("seen")),
        ahead=m.get("ahead") is True,
        terms=_terms(m.get("terms")),
        observe=m.get("observe") is True,
    )


#: Bounds on what a peer's terms may hold (a hello is read before anything is trusted).
MAX_TERMS, MAX_TERM_CHARS = 16, 64


def _terms(raw: Any) -> Terms:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or len(raw) > MAX_TERMS:
        raise ValueError("bad terms")
    return tuple((_term_text(k), _term_text(v)) for k, v in raw.items())


def _term_text(raw: Any) -> str:
    if not isinstance(raw, str) or len(raw) > MAX_TERM_CHARS:
        raise ValueError("bad term")
    return raw


def _view(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError("bad view")
    return raw


def _differences(raw: Any) -> tuple[Difference, ...]:
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_TERMS:
        raise ValueError("bad differences")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError("bad difference")
        key, job, node = (_term_text(x) for x in item)
        out.append((key, job, node))
    return tuple(out)


def _join(m: dict[str, Any]) -> Join:
    timeout_s, remaining_s = _seconds(m.get("timeout_s")), _seconds(m.get("remaining_s"))
    ref = m.get("ref")
    return Join(
        ticket=_int(m["id"]),
        ip=_ip(m["ip"]),
        history=_history(m.get("history")) if ref is None else None,
        ref=bounded_int(ref, MAX_ROUND) if ref is not None else None,
        accepted=_history(m.get("accepted")),
        earlier=_histories(m.get("earlier")),
        timeout_s=timeout_s,
        remaining_s=remaining_s or timeout_s,
        dport=_port(m.get("dport")),
        pport=_port(m.get("pport")),
        gone=gone_of(m.get("gone")),
        place=_place(m.get("place")),
        restarted=m.get("restarted") is True,
        seen=Heard.of(m.get("seen")),
    )


def _accept(m: dict[str, Any]) -> Accept:
    ok = _bool(m["ok"])
    return Accept(
        round=_int(m["round"]),
        ok=ok,
        history=None if ok else _history(m.get("history")),
        accepted=None if ok else _history(m.get("accepted")),
        earlier=() if ok else _histories(m.get("earlier")),
    )


def _arrive(m: dict[str, Any]) -> Arrive:
    epoch = m.get("epoch")
    return Arrive(_int(m["id"]), round=_int(m["round"]), epoch=None if epoch is None else _int(epoch))


def _leave(m: dict[str, Any]) -> Leave:
    try:
        left = round_key_of(m["left"]) if "left" in m else None
    except (TypeError, ValueError):
        left = None  # its departure then counts for no round: it keeps its vote
    return Leave(left)


def _close(m: dict[str, Any]) -> Close:
    return Close(
        JobEnd(_why(m.get("why")), stops_round=m.get("failed") is True, failed=m.get("job_failed") is True)
    )


def _bye(m: dict[str, Any]) -> Bye:
    leaving, gone = m.get("leaving") is True, gone_of(m.get("gone"))
    return Bye(leaving, gone) if leaving or gone else BYE


def _welcome(m: dict[str, Any]) -> Welcome:
    return Welcome(epoch=_int(m["epoch"]), status=_status(_object(m["status"])), seen=Heard.of(m.get("seen")))


def _propose(m: dict[str, Any]) -> Propose:
    covers = frozenset(
        (bounded_int(e, MAX_EPOCH), node_id(leader), bounded_int(r, MAX_ROUND))
        for e, leader, r in _list(m.get("covers") or [])
    )
    return Propose(Round.from_json(m["round"]), bounded_int(m["base"], MAX_ROUND), covers)


def _formed(m: dict[str, Any]) -> RoundFormed:
    if "round" in m:
        rnd, number = Round.from_json(m["round"]), None
    else:
        rnd, number = None, bounded_int(m["number"], MAX_ROUND)
    return RoundFormed(_int(m["id"]), round=rnd, number=number, status=_status(m.get("status")))


def _closed(m: dict[str, Any]) -> JobClosed:
    return JobClosed(_int(m.get("id", 0)), JobEnd(_why(m.get("why")), failed=m.get("failed") is True))


_FROM_NODE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "hello": _hello,
    "join": _join,
    "accept": _accept,
    "arrive": _arrive,
    "leave": _leave,
    "close": _close,
    "bye": lambda m: Bye(seen=Heard.of(m.get("seen"))) if m.get("seen") else BYE,
}
_FROM_LEADER: dict[str, Callable[[dict[str, Any]], Any]] = {
    "welcome": _welcome,
    "reject": lambda m: Reject(_text(m["why"])),
    "mismatch": lambda m: Mismatch(_differences(m["diffs"])),
    "view": lambda m: View(_view(m["view"])),
    "propose": _propose,
    "members": lambda m: Members(Round.from_json(m["round"])),
    "round": _formed,
    "wait": lambda m: Wait(
        _int(m["id"]), _text(m["reason"]), _bool(m["parked"]), Heard.of(m.get("seen")), WaitKind(m["cause"])
    ),
    "retry": lambda m: Retry(_int(m["id"]), _text(m["why"])),
    "timeout": lambda m: JoinTimedOut(_int(m["id"]), _text(m["why"])),
    "closed": _closed,
    "status": lambda m: StatusPush(_status(_object(m["status"]))),
    "ack": lambda m: Ack(_int(m["id"])),
    "evicted": lambda m: Evicted(_text(m["why"])),
    "next": lambda m: Next(bounded_int(m["port"], 65535, low=1)),
    "bye": _bye,
}
#: Every kind of frame, "challenge" (``_wire.Seal``'s) and "hb" included.
_KINDS = frozenset(_FROM_NODE) | frozenset(_FROM_LEADER) | {"challenge", "hb"}


# --------------------------------------------------------------------------- fields


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any) -> int:
    """An integer a frame must carry (a ticket, a round number): any JSON integer."""
    if not _is_int(value):
        raise TypeError(f"not an integer: {str(value)[:40]!r}")
    return int(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"not true or false: {str(value)[:40]!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not text: {str(value)[:40]!r}")
    return value[:MAX_WHY_CHARS]


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_MEMBERS:
        raise TypeError("not a list")
    return value


def _why(raw: Any) -> str:
    """A reason that only informs: its text (at most ``MAX_WHY_CHARS``), "" for anything else."""
    return raw[:MAX_WHY_CHARS] if isinstance(raw, str) else ""


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"not an object: {str(value)[:40]!r}")
    return value


def _history(raw: Any) -> History | None:
    return History.from_json(raw) if raw is not None else None


def _histories(raw: Any) -> tuple[History, ...]:
    """A node's earlier votes (``Ballot.earlier``): at most ``MAX_HEARD`` (``MAX_EARLIER``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_HEARD:
        raise ValueError("bad earlier votes")
    return tuple(History.from_json(h) for h in raw)


def _status(raw: Any) -> Status | None:
    """A status that only informs: None for a bad one (the node keeps what it knew)."""
    try:
        return Status.from_json(raw)
    except _BAD_FIELD:
        return None


def _seconds(raw: Any) -> float:
    """A join's timeout from a peer: at least ``MIN_JOIN_WAIT_S``; 0 (none) for no or a bad value."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return 0.0
    try:
        value = float(raw)
    except OverflowError:
        return 0.0
    return max(MIN_JOIN_WAIT_S, value) if math.isfinite(value) and 0 < value < 1e9 else 0.0


def _port(raw: Any) -> int:
    """A join's discovery or probe port, if it is one, else 0 (unknown)."""
    try:
        return bounded_int(raw, 65535)
    except ValueError:
        return 0


def _place(raw: Any) -> str:
    """A join's place in rank order (``_order``), if it is a short string, else "" (none)."""
    return raw if isinstance(raw, str) and len(raw) <= MAX_PLACE_CHARS else ""


def _ip(raw: Any) -> str:
    """A peer's address as it reported it, if it is one (short and canonical), else ``?``; the
    field itself must be text."""
    if not isinstance(raw, str):
        raise TypeError(f"not an address: {str(raw)[:40]!r}")
    try:
        return peer_ip(raw)
    except ValueError:
        return "?"


#: A challenge past the handshake, or without a secret: what ``from_leader`` reads it as.
_CHALLENGE_OUT_OF_TURN = from_leader({"t": "challenge"})
