"""The wire: discovery datagrams, and the frames of the control connection to the leader.

Datagram layout (network byte order; every length explicit; the whole datagram at most
``MAX_DATAGRAM_BYTES``)::

    magic "MNGL" | version u8 | type u8 | flags u8 | job_len u8 | job (UTF-8, job_len bytes)
    sender u64 | sent_ms u64 | nonce u64 | body_len u16 | body (body_len bytes)
    [tag: 32 bytes HMAC-SHA256 over everything before it, when flags has FLAG_TAG]

``decode`` never raises on input bytes: whatever is wrong comes back as ``Invalid(reason)``
for the caller to count. With a key, a datagram must carry a valid tag, be recent
(``sent_ms`` within the replay window of the receiver's clock) and not repeat a
(sender, nonce) pair already seen; a second copy of a datagram that arrives within
``DUPLICATE_WINDOW_MS`` (several interfaces, broadcast, ``peers=``) is a ``duplicate``, not
a replay.

Epochs are 64-bit and at most ``EPOCH_MAX``. An IPv6 link-local address travels without
its scope: a scope is local to each host, so the receiver gives it the scope of the
interface the datagram arrived on (``with_scope_of``).

Control frames (TCP, node <-> leader): a u32 length, then one JSON object with a type
``t``. ``FrameReader`` splits a stream into frames, each read at once into its typed record
by the stream's ``decode`` (``_frames``), and never raises either; ``Seal`` checks each
frame's MAC on the bytes as they came (``Framed``).
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import hmac
import ipaddress
import json
import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from torch_mingle._record import field, record

MAGIC = b"MNGL"
#: 5: rounds are proposed, accepted, then formed (``_rounds``), which a node of version 4
#: cannot do; 6: a join names a round its leader delivered by number (``ref``), which a
#: leader of version 5 would read as no history, and a formed round comes once as ``members``
#: and is named by number; 7: a round's per-member lists travel as one compressed string
#: (``_records.Round.to_json``: ``columns``), which a node of version 6 cannot read; 8: a query
#: says the highest round its node heard of (``Query.round_seen``); 9: a round heard of is named
#: by its key (epoch, leader, number), in queries, announcements and frames (``_records.Heard``),
#: not by its number; 10: a leader's "wait" says why (``WaitKind``); 11: an announcement of a
#: closed job says whether it failed (``ANNOUNCE_FAILED``), a flag version 10 refuses; 12: a
#: resignation says the rounds its node heard of (``Resign.heard``), and each round heard of
#: says its line where its sayer knew it (``_records.Heard.lines``); 13: a join and a refusal
#: tell the votes their node's later ones replaced (``Ballot.told``), a base numbered as high
#: as a vote excuses it only on the vote's line (``_quorum.may_accept``), and a datagram carries
#: up to 12 rounds heard of (``MAX_KEYS``), which version 12 refuses.
#: Nodes of different versions drop each other's datagrams (bad_version).
VERSION = 13
MAX_DATAGRAM_BYTES = 1200
TAG_BYTES = 32
FLAG_TAG = 0x01
MAX_ADDRS = 16
REPLAY_WINDOW_MS = 30_000
MAX_REMEMBERED_NONCES = 8192
DUPLICATE_WINDOW_MS = 2_000
#: Epochs stay far below 2**64: a claim is always ``max seen + 1``, and the discovery core
#: refuses epochs that jump too far ahead, so the space is never exhausted.
EPOCH_MAX = 2**62

_HEAD = struct.Struct("!4sBBBB")
_IDS = struct.Struct("!QQQH")
_QUERY = struct.Struct("!QB")
_KEY = struct.Struct("!QQI")
_NO_KEY = bytes(_KEY.size)
#: Round keys a datagram carries at most (``_records.MAX_HEARD``).
MAX_KEYS = 12
_ANNOUNCE = struct.Struct("!QIHHHHB")
_RESIGN = struct.Struct("!Q")
_PORT = struct.Struct("!H")
ANNOUNCE_CLOSED = 0x01
ANNOUNCE_ESTABLISHED = 0x02
ANNOUNCE_FAILED = 0x04
U16_MAX = 0xFFFF
U32_MAX = 0xFFFF_FFFF


KEY_CONTEXT = b"torch_mingle/discovery/v1"


def derive_key(secret: bytes) -> bytes:
    """The HMAC key for discovery datagrams, derived from the job's shared secret."""
    return hmac.new(secret, KEY_CONTEXT, hashlib.sha256).digest()


class MsgType(enum.IntEnum):
    QUERY = 1
    ANNOUNCE = 2
    RESIGN = 3
    PROBE = 4


@record
class Query:
    """ "Who leads this job?" from a node; also its candidacy during an election.

    ``round_seen``: the highest round of the job its node heard of: whoever hears the query
    knows that the job ran, and founds no job of its own alone (``OtherTerms.unaccounted``).
    """

    epoch_seen: int
    addrs: tuple[str, ...] = ()
    #: Them, as (epoch, leader, round), with their lines' where known, newest first
    #: (``_records.Heard``).
    round_seen: tuple[tuple[int, ...], ...] = ()

    type = MsgType.QUERY


@record
class Announce:
    """The leader's claim: epoch, where its control port listens, and the job's state.

    ``established``: the leader formed a round in its term, or a majority of the last
    round's members follow it. Only an established claim can replace an established leader.
    ``followers``: how many nodes hold a control connection to this leader, rounded down to a
    power of two (capped at 65,535): between claims of the same epoch, the one more nodes
    follow wins.
    """

    epoch: int
    store_ip: str
    store_port: int
    round: int = 0
    members: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    closed: bool = False
    established: bool = False
    followers: int = 0
    #: The job closed because it failed (an agent failed, or a round could not start): a node
    #: that hears only this announcement does not take the job for finished.
    failed: bool = False
    #: The rounds of the job the leader knows ran, as (epoch, leader, round), newest first
    #: (``_records.Heard``): who hears it knows which rounds ran, not only the highest number.
    heard: tuple[tuple[int, ...], ...] = ()

    type = MsgType.ANNOUNCE


@record
class Resign:
    """The leader of ``epoch`` steps down (its job closed or it is shutting down). ``heard``:
    the rounds of the job its node heard of, as its queries say them: its last word may be the
    only one a late node gets, which then founds nothing beside them."""

    epoch: int
    heard: tuple[tuple[int, ...], ...] = ()

    type = MsgType.RESIGN


@record
class Probe:
    """Asks which jobs are here (``python -m torch_mingle ls``): every leader answers, whatever its job."""

    type = MsgType.PROBE


PROBE_JOB = "*"

Body = Query | Announce | Resign | Probe


@record
class Datagram:
    job: str
    sender: int
    body: Body
    sent_ms: int = 0
    nonce: int = 0


@record
class Invalid:
    """Why a datagram was dropped; ``reason`` is a short stable token used as a counter key."""

    reason: str
    #: Signed with the job's secret, but sent outside the replay window (a clock that differs,
    #: or a replay): not to be acted on, but what it says of the job is authentic.
    stale: Datagram | None = field(default=None, compare=False)
    #: The job the datagram names, where its header could be read (unauthenticated: it only
    #: tells a node that datagrams naming its job arrive, signed with another secret, say).
    job: str | None = field(default=None, compare=False)


class _Stale(Exception):
    """An authentic datagram outside the replay window."""

    def __init__(self, dgram: Datagram) -> None:
        super().__init__("outside_replay_window")
        self.dgram = dgram


def _job_named(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


class _Bad(Exception):
    """Internal: carries the drop reason (and the job named, if read) out of the parsing helpers."""

    def __init__(self, reason: str, job: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.job = job


@functools.lru_cache(maxsize=4096)
def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address ``text`` names (an IP literal; a ``%scope`` is dropped); ``ValueError`` if it
    names none. Cached: a leader of a thousand nodes parses the same addresses again and
    again (a tenth of a new leader's CPU went here)."""
    return ipaddress.ip_address(text.partition("%")[0])


@functools.lru_cache(maxsize=4096)
def _addr_text(packed: bytes) -> str:
    return str(ipaddress.ip_address(packed))


def _encode_addr(addr: str) -> bytes:
    ip = parse_ip(addr)
    return bytes([ip.version]) + ip.packed


def _decode_addr(buf: bytes, pos: int) -> tuple[str, int]:
    if pos >= len(buf):
        raise _Bad("truncated_addr")
    family = buf[pos]
    if family == 4:
        end = pos + 5
        if end > len(buf):
            raise _Bad("truncated_addr")
        return _addr_text(buf[pos + 1 : end]), end
    if family == 6:
        end = pos + 17
        if end > len(buf):
            raise _Bad("truncated_addr")
        return _addr_text(buf[pos + 1 : end]), end
    raise _Bad("bad_addr_family")


def with_scope_of(ip: str, source: object) -> str:
    """``ip`` as this host reaches it: a link-local IPv6 address gets the scope of ``source``.

    ``source`` is the sender's socket address as the receiving socket reported it; for a
    link-local sender it carries this host's scope (``fe80::1%eth0``), the interface the
    datagram came in on. Other addresses are returned as they are.
    """
    try:
        addr = parse_ip(ip)
    except ValueError:
        return ip
    if addr.version != 6 or not addr.is_link_local:
        return ip
    src = str(source[0]) if isinstance(source, tuple) and source else ""
    _, _, scope = src.partition("%")
    if not scope and isinstance(source, tuple) and len(source) >= 4 and source[3]:
        index = int(str(source[3]))
        scope = SCOPE_NAMES.get(index, str(index))  # the kernel reads ``%3`` as it reads ``%eth0``
    return f"{addr}%{scope}" if scope else str(addr)


#: This host's interfaces, by index (``socket.if_nameindex``): the shell fills it when it sets a
#: node up (``_assembly``), so that a scope is named as every host of a job names it (``eth0``),
#: not by this host's own index.
SCOPE_NAMES: dict[int, str] = {}


def _encode_body(body: Body) -> bytes:
    if isinstance(body, Query):
        addrs = body.addrs[:MAX_ADDRS]
        head = _QUERY.pack(body.epoch_seen, len(addrs))
        return head + b"".join(_encode_addr(a) for a in addrs) + _encode_keys(body.round_seen)
    if isinstance(body, Announce):
        flags = (
            (ANNOUNCE_CLOSED if body.closed else 0)
            | (ANNOUNCE_ESTABLISHED if body.established else 0)
            | (ANNOUNCE_FAILED if body.failed else 0)
        )
        return (
            _ANNOUNCE.pack(
                body.epoch,
                min(body.round, U32_MAX),
                min(body.members, U16_MAX),
                min(body.min_nodes, U16_MAX),
                min(body.max_nodes, U16_MAX),
                min(body.followers, U16_MAX),
                flags,
            )
            + _encode_addr(body.store_ip)
            + _PORT.pack(body.store_port)
            + _encode_keys(body.heard)
        )
    if isinstance(body, Resign):
        return _RESIGN.pack(body.epoch) + _encode_keys(body.heard)
    return b""


def _encode_keys(keys: tuple[tuple[int, ...], ...]) -> bytes:
    """Rounds heard of: a count, then each one's key and its line's first round (zeros: not
    said; ``_records.Heard``)."""
    keys = keys[:MAX_KEYS]
    return bytes([len(keys)]) + b"".join(
        _KEY.pack(k[0], k[1], min(k[2], U32_MAX))
        + (_KEY.pack(k[3], k[4], min(k[5], U32_MAX)) if len(k) > 3 else _NO_KEY)
        for k in keys
    )


def _decode_keys(buf: bytes, pos: int) -> tuple[tuple[tuple[int, ...], ...], int]:
    """Rounds heard of (a count, then (epoch, leader, round) and its line's each) at ``pos``,
    each as (epoch, leader, round) or, with its line, the six; and where they end."""
    if pos >= len(buf):
        raise _Bad("truncated_body")
    count, pos = buf[pos], pos + 1
    if count > MAX_KEYS:
        raise _Bad("bad_field")
    if pos + count * 2 * _KEY.size > len(buf):
        raise _Bad("truncated_body")
    keys: list[tuple[int, ...]] = []
    for _ in range(count):
        key, line = _KEY.unpack_from(buf, pos), _KEY.unpack_from(buf, pos + _KEY.size)
        pos += 2 * _KEY.size
        for epoch, leader, number in (key, line) if any(line) else (key,):
            if not 0 < epoch <= EPOCH_MAX or not leader or not number:
                raise _Bad("bad_field")
        keys.append((*key, *line) if any(line) else key)
    return tuple(keys), pos


def _decode_body(kind: int, buf: bytes) -> Body:
    if kind == MsgType.QUERY:
        if len(buf) < _QUERY.size:
            raise _Bad("truncated_body")
        epoch_seen, count = _QUERY.unpack_from(buf)
        if count > MAX_ADDRS:
            raise _Bad("too_many_addrs")
        if epoch_seen > EPOCH_MAX:
            raise _Bad("bad_epoch")
        pos = _QUERY.size
        addrs = []
        for _ in range(count):
            addr, pos = _decode_addr(buf, pos)
            addrs.append(addr)
        seen, pos = _decode_keys(buf, pos)
        if pos != len(buf):
            raise _Bad("body_length_mismatch")
        return Query(epoch_seen=epoch_seen, addrs=tuple(addrs), round_seen=seen)
    if kind == MsgType.ANNOUNCE:
        if len(buf) < _ANNOUNCE.size:
            raise _Bad("truncated_body")
        epoch, rnd, members, min_nodes, max_nodes, followers, flags = _ANNOUNCE.unpack_from(buf)
        ip, pos = _decode_addr(buf, _ANNOUNCE.size)
        if pos + _PORT.size > len(buf):
            raise _Bad("truncated_body")
        (port,) = _PORT.unpack_from(buf, pos)
        heard, pos = _decode_keys(buf, pos + _PORT.size)
        if pos != len(buf):
            raise _Bad("body_length_mismatch")
        if port == 0:
            raise _Bad("bad_field")
        if not 0 < epoch <= EPOCH_MAX:
            raise _Bad("bad_epoch")
        if flags & ~(ANNOUNCE_CLOSED | ANNOUNCE_ESTABLISHED | ANNOUNCE_FAILED):
            raise _Bad("bad_flags")
        return Announce(
            epoch=epoch,
            store_ip=ip,
            store_port=port,
            round=rnd,
            members=members,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            closed=bool(flags & ANNOUNCE_CLOSED),
            established=bool(flags & ANNOUNCE_ESTABLISHED),
            failed=bool(flags & ANNOUNCE_FAILED),
            followers=followers,
            heard=heard,
        )
    if kind == MsgType.RESIGN:
        if len(buf) < _RESIGN.size:
            raise _Bad("truncated_body")
        (epoch,) = _RESIGN.unpack_from(buf)
        heard, pos = _decode_keys(buf, _RESIGN.size)
        if pos != len(buf):
            raise _Bad("body_length_mismatch")
        if not 0 < epoch <= EPOCH_MAX:
            raise _Bad("bad_epoch")
        return Resign(epoch=epoch, heard=heard)
    if kind == MsgType.PROBE:
        if buf:
            raise _Bad("body_length_mismatch")
        return Probe()
    raise _Bad("bad_type")


class Codec:
    """Encodes and decodes datagrams; with a key it signs and verifies them."""

    def __init__(self, key: bytes | None = None, *, replay_window_ms: int = REPLAY_WINDOW_MS) -> None:
        self.key = key
        self.replay_window_ms = replay_window_ms
        self._seen: OrderedDict[tuple[int, int], tuple[int, bytes]] = OrderedDict()

    @property
    def authenticated(self) -> bool:
        return self.key is not None

    @property
    def remembered(self) -> int:
        """(sender, nonce) pairs kept for the replay check (at most ``MAX_REMEMBERED_NONCES``)."""
        return len(self._seen)

    def encode(self, dgram: Datagram) -> bytes:
        job = dgram.job.encode("utf-8")
        body = _encode_body(dgram.body)
        flags = FLAG_TAG if self.key is not None else 0
        out = (
            _HEAD.pack(MAGIC, VERSION, int(dgram.body.type), flags, len(job))
            + job
            + _IDS.pack(dgram.sender, dgram.sent_ms, dgram.nonce, len(body))
            + body
        )
        if self.key is not None:
            out += hmac.new(self.key, out, hashlib.sha256).digest()
        if len(out) > MAX_DATAGRAM_BYTES:
            raise ValueError(f"datagram of {len(out)} bytes exceeds {MAX_DATAGRAM_BYTES}")
        return out

    def decode(self, data: bytes, wall_ms: int | None = None) -> Datagram | Invalid:
        """Parse ``data``; never raises. ``wall_ms`` (the receiver's clock) enables the replay check."""
        try:
            return self._decode(bytes(data), wall_ms)
        except _Stale as stale:
            return Invalid("outside_replay_window", stale=stale.dgram)
        except _Bad as bad:
            return Invalid(bad.reason, job=bad.job)
        except Exception:
            return Invalid("decoder_error")

    def _decode(self, data: bytes, wall_ms: int | None) -> Datagram:
        if len(data) > MAX_DATAGRAM_BYTES:
            raise _Bad("too_long")
        if len(data) < _HEAD.size:
            raise _Bad("too_short")
        magic, version, kind, flags, job_len = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise _Bad("bad_magic")
        pos = _HEAD.size
        job = _job_named(data[pos : pos + job_len]) if job_len else None
        if version != VERSION:
            raise _Bad("bad_version", job)  # the job as this version's header would place it
        if kind not in MsgType.__members__.values():
            raise _Bad("bad_type", job)
        if flags & ~FLAG_TAG:
            raise _Bad("bad_flags", job)
        if job_len == 0 or pos + job_len + _IDS.size > len(data):
            raise _Bad("truncated_header")
        pos += job_len
        sender, sent_ms, nonce, body_len = _IDS.unpack_from(data, pos)
        pos += _IDS.size
        tag_len = TAG_BYTES if flags & FLAG_TAG else 0
        if pos + body_len + tag_len != len(data):
            raise _Bad("length_mismatch", job)
        if self.key is not None:
            if not tag_len:
                # ``torch-mingle ls`` or ``doctor`` without --secret-file: not a fault of the job's.
                raise _Bad("unsigned_probe" if kind == MsgType.PROBE else "missing_tag", job)
            expected = hmac.new(self.key, data[: pos + body_len], hashlib.sha256).digest()
            if not hmac.compare_digest(expected, data[pos + body_len :]):
                raise _Bad("bad_tag", job)
        elif tag_len:
            raise _Bad("unexpected_tag", job)
        if sender == 0:
            raise _Bad("bad_sender", job)
        if job is None:
            raise _Bad("bad_job")
        body = _decode_body(kind, data[pos : pos + body_len])
        dgram = Datagram(job=job, sender=sender, body=body, sent_ms=sent_ms, nonce=nonce)
        if self.key is not None and wall_ms is not None:
            if abs(wall_ms - sent_ms) > self.replay_window_ms:
                raise _Stale(dgram)
            self._check_replay(sender, nonce, wall_ms, data[pos + body_len :])
        return dgram

    def _check_replay(self, sender: int, nonce: int, wall_ms: int, tag: bytes) -> None:
        key = (sender, nonce)
        first = self._seen.get(key)
        if first is not None:
            first_ms, first_tag = first
            # The same datagram again within moments: delivered twice (several interfaces,
            # broadcast and peers= paths), not replayed by someone else.
            if first_tag == tag and wall_ms - first_ms <= DUPLICATE_WINDOW_MS:
                raise _Bad("duplicate")
            raise _Bad("replayed")
        self._seen[key] = (wall_ms, tag)
        if len(self._seen) > MAX_REMEMBERED_NONCES:
            self._seen.popitem(last=False)


# --------------------------------------------------------------------------- control frames

FRAME_HEADER = struct.Struct("!I")
#: A round of a few thousand members (ids and addresses) fits with room to spare.
MAX_FRAME_BYTES = 4 * 1024 * 1024


def encode_frame(kind: str, *, encoded: Mapping[str, str] | None = None, **fields: Any) -> bytes:
    """One control message: its length, then the JSON object ``{"t": kind, **fields}``.

    ``encoded``: fields whose values are JSON text already (a round's member list, encoded
    once for all its members instead of once per member).
    """
    text = dumps_compact({"t": kind, **fields})
    if encoded:
        text = text[:-1] + "".join(f",{json.dumps(k)}:{v}" for k, v in encoded.items()) + "}"
    body = text.encode()
    return FRAME_HEADER.pack(len(body)) + body


def dumps_compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def deflated(data: bytes) -> str:
    """``data`` compressed (zlib) as base64 text, for a JSON field: a round's member list is
    sent once per member, so its size, not the leader's CPU, is what a large round costs."""
    return base64.b64encode(zlib.compress(data)).decode("ascii")


def inflated(raw: Any, max_bytes: int) -> bytes:
    """``deflated``'s bytes back; ``ValueError`` for other text, and for more than
    ``max_bytes`` once inflated (a small frame must not unpack into gigabytes); ``TypeError``
    for anything but text."""
    if not isinstance(raw, str):
        raise TypeError("not deflated text")
    try:
        packed = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(packed, max_bytes + 1)
    except zlib.error as exc:
        raise ValueError(f"not zlib data: {exc}") from None
    if len(data) > max_bytes or inflater.unconsumed_tail:
        raise ValueError(f"more than {max_bytes} bytes once inflated")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("truncated or trailing zlib data")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")  # NaN and Infinity: not JSON, and not numbers we use


SEAL_FIELD = "m"
CONTROL_CONTEXT = b"torch_mingle/control/v1"
NONCE_BYTES = 16
TAG_HEX = 32
_SEAL_SUFFIX = len(',"m":"') + TAG_HEX + len('"}')


def frame_digest(frame: bytes) -> bytes:
    """The digest a frame's seal covers (computed once for a frame sent to many: ``Seal.seal``)."""
    return hashlib.sha256(memoryview(frame)[FRAME_HEADER.size :]).digest()


class Seal:
    """One control connection's authentication, with a secret: a challenge, then a MAC on every frame.

    The leader opens with ``challenge`` (its nonce). The follower's ``hello`` carries its own
    nonce and a MAC keyed from the secret and the leader's nonce: a host without the secret
    cannot say hello, and a hello seen on another connection fails on this one. From then on
    both sides hold a key for this connection alone (from the secret and both nonces), and every
    frame carries a MAC over its direction, its place in the stream and its text: nothing can
    be added, replayed, reordered or sent back; the leader's ``welcome``, sealed so, shows the
    follower that the leader knows the secret too. Without a secret there is no ``Seal``, and
    any host that reaches the control port may join (docs/security.md#without-a-secret).
    """

    def __init__(self, key: bytes, *, leader: bool) -> None:
        self._key = hmac.new(key, CONTROL_CONTEXT, hashlib.sha256).digest()
        self._leader = leader
        self._nonce = os.urandom(NONCE_BYTES)
        self._session: bytes | None = None
        self._sent = 0
        self._seen = 0

    @property
    def ready(self) -> bool:
        """The handshake is done: frames are sealed and checked with this connection's key."""
        return self._session is not None

    # the leader's side
    def challenge(self) -> bytes:
        return encode_frame("challenge", n=self._nonce.hex())

    def check_hello(self, framed: Framed) -> bool:
        """Whether ``framed`` is a hello sealed for this connection; then the session key is set."""
        try:
            theirs = bytes.fromhex(str(framed.nonce)) if framed.nonce is not None else b""
        except ValueError:
            return False
        if len(theirs) != NONCE_BYTES or not _verify(self._hello_key(self._nonce), b"F", 0, framed):
            return False
        self._session = self._session_key(self._nonce, theirs)
        self._seen = 1
        return True

    # the follower's side
    def hello(self, nonce: str, **fields: Any) -> bytes | None:
        """The hello for the leader's challenge of ``nonce`` (None if it is not one); the
        session key is set."""
        try:
            theirs = bytes.fromhex(nonce)
        except ValueError:
            return None
        if len(theirs) != NONCE_BYTES:
            return None
        self._session = self._session_key(theirs, self._nonce)
        frame = encode_frame("hello", cn=self._nonce.hex(), **fields)
        self._sent = 1
        return _sealed(frame, _tag(self._hello_key(theirs), b"F", 0, frame_digest(frame)))

    # both sides, after the handshake
    def seal(self, frame: bytes, digest: bytes | None = None) -> bytes:
        """``frame`` with this connection's MAC (``digest``: ``frame_digest(frame)``, if known)."""
        if self._session is None:
            raise ValueError("no session key yet: the handshake is not done")
        tag = _tag(self._session, b"L" if self._leader else b"F", self._sent, digest or frame_digest(frame))
        self._sent += 1
        return _sealed(frame, tag)

    def open(self, framed: Framed) -> bool:
        """Whether ``framed`` is the other side's next frame, sealed with this connection's key."""
        direction = b"F" if self._leader else b"L"
        if self._session is None or not _verify(self._session, direction, self._seen, framed):
            return False
        self._seen += 1
        return True

    def _hello_key(self, leader_nonce: bytes) -> bytes:
        return hmac.new(self._key, b"hello" + leader_nonce, hashlib.sha256).digest()

    def _session_key(self, leader_nonce: bytes, follower_nonce: bytes) -> bytes:
        return hmac.new(self._key, b"session" + leader_nonce + follower_nonce, hashlib.sha256).digest()


def _tag(key: bytes, direction: bytes, seq: int, digest: bytes) -> str:
    return hmac.new(key, direction + seq.to_bytes(8, "big") + digest, hashlib.sha256).hexdigest()[:TAG_HEX]


def _sealed(frame: bytes, tag: str) -> bytes:
    """``frame`` with the tag as its last field: one copy of it (a round's frame is large)."""
    suffix = f',"{SEAL_FIELD}":"{tag}"}}'.encode()
    size = len(frame) - FRAME_HEADER.size - 1 + len(suffix)
    return b"".join((FRAME_HEADER.pack(size), memoryview(frame)[FRAME_HEADER.size : -1], suffix))


def _verify(key: bytes, direction: bytes, seq: int, framed: Framed) -> bool:
    raw, tag = framed.raw, framed.tag
    if not isinstance(tag, str) or len(raw) <= _SEAL_SUFFIX:
        return False
    if not raw.endswith(f'"{tag}"}}'.encode()) or len(tag) != TAG_HEX:
        return False
    text = raw[:-_SEAL_SUFFIX] + b"}"
    expected = _tag(key, direction, seq, hashlib.sha256(text).digest())
    return hmac.compare_digest(expected, tag)


#: A heartbeat as ``encode_frame("hb")`` writes it (``FrameReader`` reads it without JSON).
HB_BODY = b'{"t":"hb"}'


@record
class Framed:
    """One control frame as it arrived: what it says (``frame``: the record its stream's
    ``decode`` made of it, or ``Invalid``), and what the connection's seal checks
    (``Seal.open``, ``Seal.check_hello``): its bytes, its tag, and a hello's nonce. Nothing
    past the reader holds a frame as a dict."""

    frame: object
    raw: bytes
    #: The seal's field, as the peer sent it (any JSON value: the seal checks it).
    tag: object = None
    #: A hello's ``cn``, the follower's nonce (as the peer sent it).
    nonce: object = None


#: What a stream's frames are read into: ``_frames.from_node`` on a connection to the control
#: port, ``_frames.from_leader_stream`` on one to the leader.
Decode = Callable[[dict[str, Any]], object]


class FrameReader:
    """Splits a byte stream into frames, each read into its record by ``decode`` (``Framed``);
    never raises: garbage gives ``Invalid``."""

    def __init__(
        self, decode: Decode, max_bytes: int = MAX_FRAME_BYTES, first_max_bytes: int | None = None
    ) -> None:
        """``first_max_bytes``: a tighter limit for the first frame (a hello is small)."""
        self.max_bytes = max_bytes
        self._limit = first_max_bytes or max_bytes
        self._buf = bytearray()
        self._decode = decode
        #: An unsealed heartbeat, the most frames of a large job: read once, for every one.
        self._beat = Framed(decode({"t": "hb"}), HB_BODY)

    @property
    def pending(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Framed] | Invalid:
        self._buf += data
        out: list[Framed] = []
        while len(self._buf) >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(self._buf)
            if size > self._limit:
                return Invalid("frame_too_long")
            end = FRAME_HEADER.size + size
            if len(self._buf) < end:
                break
            raw = bytes(self._buf[FRAME_HEADER.size : end])
            del self._buf[:end]
            if raw == HB_BODY:  # most frames of a large job: no JSON decoder for them
                out.append(self._beat)
                self._limit = self.max_bytes
                continue
            try:
                msg = json.loads(raw, parse_constant=_no_constant)
            except (ValueError, RecursionError):
                return Invalid("bad_json")
            if not isinstance(msg, dict):
                return Invalid("not_an_object")
            self._limit = self.max_bytes
            try:
                frame = self._decode(msg)
            except Exception as exc:
                frame = Invalid(f"an unreadable {str(msg.get('t'))[:20]!r} frame ({type(exc).__name__})")
            out.append(Framed(frame, raw, msg.get(SEAL_FIELD), msg.get("cn")))
        return out
