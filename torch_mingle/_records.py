"""The records of a job's rounds, and their wire forms: ``History`` (a round as a node knows
it), ``Round`` (a formed round, as its members get it), ``Heard`` (the rounds a node heard
of), ``Status`` (the job as a leader tells it), and the bounds on what a peer may send.

Pure values: the leader's term (``_rounds``), the member's ballot (``_ballot``), the frames
(``_frames``) and the state file (``_identity``) all read and write them.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Iterable
from typing import Any

from torch_mingle._keys import RoundKey, age
from torch_mingle._record import field, record
from torch_mingle._wire import deflated, dumps_compact, inflated, parse_ip

#: Rounds both ends of a control connection remember as answered on it (the leader's
#: ``Member.delivered``, the follower's ``FollowerSession.delivered``): a join names one of
#: them by number. Both keep them the same way, so they always agree.
MAX_ROUNDS_DELIVERED = 4


def keep_delivered(delivered: dict[int, Round], rnd: Round) -> None:
    """``rnd`` was answered on a connection: both ends record it here, the same way, so that a
    join's ``ref`` names a round the leader still holds."""
    delivered[rnd.number] = rnd
    while len(delivered) > MAX_ROUNDS_DELIVERED:
        del delivered[next(iter(delivered))]


#: Bounds on what a peer may send: the fields of a history, round or status never exceed them.
MAX_MEMBERS = 65536
MAX_ROUND = 2**32 - 1
MAX_EPOCH = 2**62
MAX_IP_CHARS = 64


def node_hex(node: int) -> str:
    return f"{node:016x}"


def bounded_int(value: Any, high: int, low: int = 0) -> int:
    """An integer from a peer's JSON, within ``low..high``; ``ValueError`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"not an integer in {low}..{high}: {str(value)[:40]!r}")
    return value


def node_id(value: Any) -> int:
    """A node id from a peer's JSON: 1 to 16 hex digits, not zero."""
    if not isinstance(value, str) or not 0 < len(value) <= 16:
        raise ValueError(f"not a node id: {str(value)[:40]!r}")
    node = int(value, 16)
    if node == 0:
        raise ValueError("node id 0")
    return node


#: A round, as (epoch, leader, number): which round it is, across terms.
#: Nodes that left the job, each with the round it left (None: unknown).
Gone = tuple[tuple[int, RoundKey | None], ...]
#: The lines of the job a round continues: the key of its own line's first round, then those of
#: the other lines it took in. A job has more than one line only where a split at its start let
#: each side found one; where they meet, the round that takes a member of the other line in
#: needs a majority of that line's round too, and the line is then its own (``OtherTerms.rivals``).
Lines = tuple[RoundKey, ...]
#: Lines a round names at most (its own, those it took in, and each proposal it accounted for):
#: a round that names fewer than it continues makes the next term wait for a quorum of a line
#: it cannot count (seed 1983: an 8-way split at the start named 10 and kept 8).
MAX_LINES = 16


#: Rounds a node keeps (and says) it heard of: the newest ones, one per term and one per line (a
#: node that heard of more lines than it keeps could form a round beside one it forgot: seed
#: 70007446, five sides of a split at the start kept four); as many as the largest datagram
#: carries with everything else at its largest (``_wire.MAX_KEYS``).
MAX_HEARD = 12


class WaitKind(enum.Enum):
    """Why no round forms now (``RoundBook.decide``), as the leader's ``wait`` answer says it
    beside its text: what a node decides on, where the text is for people."""

    FIRST_JOIN = "first_join"  # nothing decided yet
    CLOSED = "closed"
    GIVES_WAY = "gives_way"  # a newer term formed or proposed a round
    LEADERS_JOIN = "leaders_join"  # the leader's own join is not in yet
    TOO_FEW = "too_few"  # fewer than min_nodes
    FIRST_MAJORITY = "first_majority"  # a first round waits for more than half of max_nodes
    LAST_CALL = "last_call"
    NO_QUORUM = "no_quorum"


#: A round heard of, as it travels: its key, then the key of its line's first round where the
#: sayer knew it (``Round.lines``): a 3-tuple or a 6-tuple.
Entry = tuple[int, ...]


@record
class Heard:
    """The rounds of the job a node heard of, by any authentic word (an announcement, a query,
    a frame of its leader, a round it was in): newest first in ``age`` order, one per term (a
    term's rounds form a chain), at most ``MAX_HEARD``. A round is named by its key, not its
    number: two sides of a split at the job's start each run a round 1, and a node must tell the
    one whose members it knows from the one it only heard of (``OtherTerms.unaccounted``); and
    by its line where the sayer knew it (``lines``: the first round of the line each key is
    of, None where not said), so that a round numbered below a base is told from its ancestors
    by what it is, not by its number."""

    keys: tuple[RoundKey, ...] = ()
    lines: tuple[RoundKey | None, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.keys)

    @property
    def round(self) -> int:
        """The highest round number heard of (0: none)."""
        return self.keys[0][2] if self.keys else 0

    def line_of(self, key: RoundKey) -> RoundKey | None:
        """The first round of ``key``'s line, where it was said (None: not said)."""
        for k, line in self._pairs():
            if k == key:
                return line
        return None

    def _pairs(self) -> list[tuple[RoundKey, RoundKey | None]]:
        """Each key with its line (None where not said)."""
        return list(zip(self.keys, self.lines or (None,) * len(self.keys), strict=True))

    def entries(self) -> tuple[Entry, ...]:
        """The keys as they travel, each with its line where known."""
        return tuple(k if line is None else (*k, *line) for k, line in self._pairs())

    def with_keys(self, *entries: Entry | None) -> Heard:
        """This and ``entries`` (round keys, each with its line or not; None and round 0 are
        nothing heard), newest per term and per line (an older round of a line a newer one
        continues is accounted for wherever that one is: ``OtherTerms.unaccounted``); a line
        said once is kept."""
        merged: dict[tuple[int, int], tuple[RoundKey, RoundKey | None]] = {}
        mine = self._pairs()
        for key, line in (*mine, *(_split(e) for e in entries if e is not None)):
            if key[0] <= 0 or key[1] <= 0 or key[2] <= 0:
                continue  # nothing heard (or no round: epochs, leaders and numbers start at 1)
            old = merged.get(key[:2])
            if old is None or key[2] > old[0][2] or (key == old[0] and old[1] is None and line is not None):
                merged[key[:2]] = (key, line)
        kept: list[tuple[RoundKey, RoundKey | None]] = []
        lines: set[RoundKey | None] = set()
        for key, line in sorted(merged.values(), key=lambda kl: age(kl[0]), reverse=True):
            if line is not None and line in lines:
                continue
            kept.append((key, line))
            lines.add(line)
        kept = kept[:MAX_HEARD]
        if kept == mine:
            return self  # nothing new (the common case: a node hears its own round again)
        new_lines = tuple(line for _, line in kept)
        return Heard(
            tuple(k for k, _ in kept), new_lines if any(line is not None for line in new_lines) else ()
        )

    def with_heard(self, other: Heard) -> Heard:
        return self.with_keys(*other.entries()) if other.keys else self

    def beyond(self, floor: int, term: tuple[int, int], base: RoundKey | None) -> Heard:
        """The rounds heard of that a round of ``term`` formed from round number ``floor``
        (``base``: its key) must account for: of another term, numbered ``floor`` or above,
        not the base (``OtherTerms.unaccounted``); from 0 with no base, those a member tells
        its leader at once (``FollowerSession.tell``)."""
        kept = [(k, line) for k, line in self._pairs() if k[2] >= floor and k[:2] != term and k != base]
        if len(kept) == len(self.keys):
            return self
        return Heard(tuple(k for k, _ in kept), tuple(line for _, line in kept) if self.lines else ())

    def to_json(self) -> list[list[Any]] | None:
        return [
            [*round_key_to_json(k), *(round_key_to_json(line) if line is not None else [])]
            for k, line in self._pairs()
        ] or None

    @classmethod
    def of(cls, raw: Any) -> Heard:
        """A frame's ``seen`` (a list of round keys, each with its line or not); nothing for
        none or garbage: a bad value of an optional field means "unknown" (``_frames``)."""
        if not isinstance(raw, list) or len(raw) > MAX_HEARD:
            return NOTHING_HEARD
        try:
            return NOTHING_HEARD.with_keys(*(_entry_of(k) for k in raw))
        except (ValueError, TypeError):
            return NOTHING_HEARD


def heard_entry(key: RoundKey, line: RoundKey | None) -> Entry:
    """``key`` as it travels, with ``line`` where known."""
    return key if line is None else (*key, *line)


def _split(entry: Entry) -> tuple[RoundKey, RoundKey | None]:
    if len(entry) == 6:
        return (entry[0], entry[1], entry[2]), (entry[3], entry[4], entry[5])
    if len(entry) == 3:
        return (entry[0], entry[1], entry[2]), None
    raise ValueError("a round heard of: not a key")


def _entry_of(raw: Any) -> Entry:
    if isinstance(raw, list) and len(raw) == 6:
        return (*round_key_of(raw[:3]), *round_key_of(raw[3:]))
    return round_key_of(raw)


NOTHING_HEARD = Heard()


def round_key_of(raw: Any) -> RoundKey:
    """A frame's round key, ``[epoch, leader, round]``; ``ValueError`` (or ``TypeError``) for garbage."""
    epoch, leader, number = raw
    return (bounded_int(epoch, MAX_EPOCH), node_id(leader), bounded_int(number, MAX_ROUND))


def round_key_to_json(key: RoundKey) -> list[Any]:
    return [key[0], node_hex(key[1]), key[2]]


def gone_of(raw: Any) -> Gone:
    """A frame's ``gone`` (a join's, a leader's ``bye``): the nodes that left the job, each as
    ``[id, epoch, leader, round]`` (the newest round it was in or voted for when it left) or a
    bare id (round unknown: it counts for no round); ``ValueError`` (or ``TypeError``) for garbage."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_MEMBERS:
        raise ValueError("gone: not a list of node ids")
    out: list[tuple[int, RoundKey | None]] = []
    for item in raw:
        if isinstance(item, list):
            out.append((node_id(item[0]), round_key_of(item[1:])))
        else:
            out.append((node_id(item), None))
    return tuple(out)


def gone_to_json(gone: Iterable[tuple[int, RoundKey | None]]) -> list[Any]:
    return [[node_hex(n), *round_key_to_json(key)] if key else node_hex(n) for n, key in gone]


def members_of(value: Any) -> tuple[int, ...]:
    """A frame's member list; ``ValueError`` (or ``TypeError``: an unhashable entry) for garbage."""
    if not isinstance(value, list) or len(value) > MAX_MEMBERS:
        raise ValueError("members: not a list of at most 65536 ids")
    return _parse_members(tuple(value))


@functools.lru_cache(maxsize=4)
def _parse_members(ids: tuple[Any, ...]) -> tuple[int, ...]:
    """Every member of a round reports the same list when it re-joins (N joins of N ids each):
    the leader checks and parses it once, not N times per round (a hit costs a hash of the
    ids, in C)."""
    if not all(isinstance(m, str) for m in ids):
        raise ValueError("members: not a list of node ids")
    return tuple(node_id(m) for m in ids)


def peer_ip(value: Any) -> str:
    """An address a peer reported: an IP literal (with a short ``%scope``), else ``ValueError``."""
    if not isinstance(value, str) or len(value) > MAX_IP_CHARS:
        raise ValueError("not an address")
    _, _, scope = value.partition("%")
    ip = _canonical_ip(value)
    if scope and not (
        len(scope) <= 16 and scope.replace("-", "").replace("_", "").replace(".", "").isalnum()
    ):
        raise ValueError("bad scope")
    return f"{ip}%{scope}" if scope else ip


@functools.lru_cache(maxsize=4096)
def _canonical_ip(text: str) -> str:
    return str(parse_ip(text))


@functools.lru_cache(maxsize=8)
def _hex_ids(members: tuple[int, ...]) -> tuple[str, ...]:
    """Node ids as they travel, cached: every join of a member carries its last round's list,
    and a failover of a thousand nodes sends it twice per member (0.28 ms each at 1,024)."""
    return tuple(node_hex(m) for m in members)


@record
class History:
    """The last round a node took part in: lets a new leader recognize a re-rendezvous."""

    epoch: int
    round: int
    members: tuple[int, ...]
    #: ``members`` as a set, where one is at hand (``History.of`` a round): ``has`` is O(1).
    known: frozenset[int] | None = field(default=None, compare=False, repr=False)
    #: The lines of the job the round continues (``Round.lines``).
    lines: Lines = field(default=(), compare=False)

    @property
    def line(self) -> RoundKey | None:
        """The first round of its own line (None: not said)."""
        return self.lines[0] if self.lines else None

    def has(self, node: int) -> bool:
        """Whether ``node`` was a member (a pass over the members for a history parsed from a peer)."""
        return node in self.known if self.known is not None else node in self.members

    @property
    def term(self) -> tuple[int, int]:
        """The term that formed (or proposed) it: its epoch and its leader (rank 0)."""
        return (self.epoch, self.members[0] if self.members else 0)

    @property
    def key(self) -> tuple[int, int, int]:
        """(epoch, leader, round): which round it is, across terms."""
        return (self.epoch, self.term[1], self.round)

    def newer_than(self, other: History | None) -> bool:
        """Later in the job: a higher round number (the numbers grow along formed rounds); two
        rounds of one number (only a split at the job's start makes them) in a fixed order."""
        return other is None or age(self.key) > age(other.key)

    @classmethod
    def of(cls, rnd: Round) -> History:
        return cls(
            epoch=rnd.epoch, round=rnd.number, members=rnd.members, known=rnd.member_set, lines=rnd.lines
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "round": self.round,
            "members": list(_hex_ids(self.members)),
        }
        if self.lines:
            out["lines"] = [round_key_to_json(k) for k in self.lines]
        return out

    @classmethod
    def from_json(cls, data: Any) -> History:
        """Parse a peer's history; raises ``ValueError`` (or ``KeyError``/``TypeError``) on garbage."""
        return cls(
            epoch=bounded_int(data["epoch"], MAX_EPOCH),
            round=bounded_int(data["round"], MAX_ROUND),
            members=members_of(data["members"]),
            lines=lines_of(data.get("lines")),
        )


@record
class Round:
    """A formed round as every member receives it."""

    number: int
    epoch: int
    members: tuple[int, ...]
    store_ip: str
    store_port: int
    #: Each member's own address, in rank order (a leader on several networks picks by them).
    ips: tuple[str, ...] = ()
    #: Each member's discovery port, in rank order (0: unknown): the failover path by unicast.
    dports: tuple[int, ...] = ()
    #: Each member's data-path probe port, in rank order (0: none).
    pports: tuple[int, ...] = ()
    #: The round it was formed from, (epoch, leader, number); None for a job's first round.
    base: tuple[int, int, int] | None = None
    #: The lines of the job it continues (``Lines``): its own line's first round, then the
    #: lines it took in (empty: a round of a version that did not say).
    lines: Lines = ()

    @property
    def key(self) -> RoundKey:
        """(epoch, leader, number): which round it is, across terms (``History.key``)."""
        return (self.epoch, self.members[0] if self.members else 0, self.number)

    @property
    def world_size(self) -> int:
        return len(self.members)

    @functools.cached_property
    def encoded(self) -> str:
        """``to_json()`` as JSON text, made once: every member gets the same (N members x N ids)."""
        return dumps_compact(self.to_json())

    @functools.cached_property
    def member_set(self) -> frozenset[int]:
        return frozenset(self.members)

    def rank_of(self, node: int) -> int | None:
        try:
            return self.members.index(node)
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        # The per-member lists are one compressed string (``_pack_columns``), not N JSON values:
        # every member of an N-node round parses the round, and N JSON values each cost it
        # 5.6 ms at N = 1,024; and the leader sends the round to every member, N x N entries.
        return {
            "round": self.number,
            "epoch": self.epoch,
            "store_ip": self.store_ip,
            "store_port": self.store_port,
            "base": round_key_to_json(self.base) if self.base else None,
            "columns": _pack_columns(self.members, self.ips, self.dports, self.pports),
            "lines": [round_key_to_json(k) for k in self.lines] or None,
        }

    @classmethod
    def from_json(cls, data: Any) -> Round:
        members, ips, dports, pports = _columns_of(data["columns"])
        return cls(
            number=bounded_int(data["round"], MAX_ROUND),
            epoch=bounded_int(data["epoch"], MAX_EPOCH),
            members=members,
            store_ip=peer_ip(data["store_ip"]),
            store_port=bounded_int(data["store_port"], 65535, 1),
            ips=ips,
            dports=dports,
            pports=pports,
            base=_base_of(data.get("base")),
            lines=lines_of(data.get("lines")),
        )


def lines_of(raw: Any) -> Lines:
    """A round's or a history's ``lines``; ``ValueError`` (or ``TypeError``) for garbage."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_LINES:
        raise ValueError("bad lines")
    return tuple(round_key_of(k) for k in raw)


def _base_of(raw: Any) -> tuple[int, int, int] | None:
    return round_key_of(raw) if raw is not None else None


#: A round's columns, before compression: how many members, dports and pports follow, then
#: the ids (8 bytes each), the ports (2 bytes each), and the addresses as text,
#: space-separated, to the end.
_COLUMNS = struct.Struct(">III")
_MAX_COLUMNS_BYTES = _COLUMNS.size + MAX_MEMBERS * (8 + 2 + 2 + MAX_IP_CHARS + 1)


def _pack_columns(
    members: tuple[int, ...], ips: tuple[str, ...], dports: tuple[int, ...], pports: tuple[int, ...]
) -> str:
    """A round's per-member lists as one string (``_wire.deflated``): ids as 8 bytes, not 16
    hex digits, and the addresses and ports, much alike across a job, compressed (557 KB of
    JSON at 16,385 members on one host became 176 KB)."""
    n, d, p = len(members), len(dports), len(pports)
    numbers = struct.pack(f">{n}Q{d}H{p}H", *members, *dports, *pports)
    return deflated(_COLUMNS.pack(n, d, p) + numbers + " ".join(ips).encode())


_Columns = tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...], tuple[int, ...]]


def _columns_of(raw: Any) -> _Columns:
    """``_pack_columns``'s lists back; ``ValueError`` (``TypeError``) for anything else."""
    if not isinstance(raw, str):
        raise TypeError("columns: not a string")  # nor a key for the cache
    return _unpack_columns(raw)


@functools.lru_cache(maxsize=4)
def _unpack_columns(raw: str) -> _Columns:
    """Every member parses the same string: a process that hosts several nodes (the scale
    benchmark) parses it once."""
    data = inflated(raw, _MAX_COLUMNS_BYTES)
    if len(data) < _COLUMNS.size:
        raise ValueError("columns: too short")
    n, d, p = _COLUMNS.unpack_from(data)
    if max(n, d, p) > MAX_MEMBERS:
        raise ValueError(f"columns: {n} members, {d} and {p} ports")
    numbers = struct.Struct(f">{n}Q{d}H{p}H")
    if len(data) < _COLUMNS.size + numbers.size:
        raise ValueError("columns: truncated")
    values = numbers.unpack_from(data, _COLUMNS.size)
    members = values[:n]
    if 0 in members:
        raise ValueError("node id 0")
    return members, _packed_ips(data[_COLUMNS.size + numbers.size :]), values[n : n + d], values[n + d :]


def _packed_ips(raw: bytes) -> tuple[str, ...]:
    """A round's member addresses, space-separated (each as its node reported it, or ``?``)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ValueError("ips: not UTF-8") from None
    ips = tuple(text.split(" ")) if text else ()
    if len(ips) > MAX_MEMBERS:
        raise ValueError("ips: more addresses than members may be")
    if ips and max(map(len, ips)) > MAX_IP_CHARS:
        raise ValueError("ips: an address too long")
    return ips


@record
class JobEnd:
    """How the job ends, one record wherever the package carries it: a request of the agent
    (``set_closed()``, ``shutdown()``), a ``close`` frame, the leader's term and book, a join's
    "closed" answer and the agent's outcome (``JobOver``). The wire keeps its own fields."""

    #: Who closed it, or why, for the nodes that wait and for the agent's error.
    why: str = ""
    #: A round of it cannot start (a data path check failed): the members running that round
    #: stop their workers too, instead of waiting in a collective.
    stops_round: bool = False
    #: It failed (a round cannot start, or the closing agent failed): a node that waited for a
    #: place fails too; it does not exit 0 as the spare of a job that finished.
    failed: bool = False


@record
class Status:
    """What the leader pushes to every node as it changes (``num_nodes_waiting``, ``is_closed``)."""

    epoch: int = 0
    round: int = 0
    size: int = 0
    joined: int = 0
    waiting: int = 0
    stale: bool = False
    closed: bool = False
    reason: str = ""
    #: Why the job failed, when it was closed because a round cannot start (a data path check):
    #: the members running that round stop their workers instead of waiting in a collective.
    failed: str = ""
    #: What broke the round (``stale``): who was lost and how it was noticed, or who left.
    broken: str = ""
    #: The job was closed as failed (``LeaderTerm.close_job``): a spare welcomed after the close
    #: fails too; it does not exit 0 as the spare of a job that finished.
    job_failed: bool = False

    @property
    def failure(self) -> str:
        """Why the job failed ("" unless it was closed because a round could not start)."""
        return self.failed if self.closed else ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Any) -> Status:
        return cls(
            epoch=bounded_int(data["epoch"], MAX_EPOCH),
            round=bounded_int(data["round"], MAX_ROUND),
            size=bounded_int(data["size"], MAX_MEMBERS),
            joined=bounded_int(data["joined"], MAX_MEMBERS),
            waiting=bounded_int(data["waiting"], MAX_MEMBERS),
            stale=bool(data["stale"]),
            closed=bool(data["closed"]),
            reason=str(data.get("reason", ""))[:4000],
            failed=str(data.get("failed", ""))[:4000],
            broken=str(data.get("broken", ""))[:4000],
            job_failed=data.get("job_failed") is True,
        )
