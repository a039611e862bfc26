"""Datagram codec for discovery and election.

Layout (network byte order; every length explicit; the whole datagram at most
``MAX_DATAGRAM_BYTES``)::

    magic "MNGL" | version u8 | type u8 | flags u8 | job_len u8 | job (UTF-8, job_len bytes)
    sender u64 | sent_ms u64 | nonce u64 | body_len u16 | body (body_len bytes)
    [tag: 32 bytes HMAC-SHA256 over everything before it, when flags has FLAG_TAG]

``decode`` never raises on input bytes: whatever is wrong comes back as ``Invalid(reason)``
for the caller to count. With a key, a datagram must carry a valid tag, be recent
(``sent_ms`` within the replay window of the receiver's clock) and not repeat a
(sender, nonce) pair already seen.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import struct
from collections import OrderedDict
from dataclasses import dataclass

MAGIC = b"MNGL"
VERSION = 1
MAX_DATAGRAM_BYTES = 1200
TAG_BYTES = 32
FLAG_TAG = 0x01
MAX_ADDRS = 16
REPLAY_WINDOW_MS = 30_000
MAX_REMEMBERED_NONCES = 8192

_HEAD = struct.Struct("!4sBBBB")
_IDS = struct.Struct("!QQQH")
_QUERY = struct.Struct("!IB")
_ANNOUNCE = struct.Struct("!IIHHHB")
_RESIGN = struct.Struct("!I")
_PORT = struct.Struct("!H")
_SCOPE = struct.Struct("!I")
ANNOUNCE_CLOSED = 0x01
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


@dataclass(frozen=True)
class Query:
    """ "Who leads this job?" from a node; also its candidacy during an election."""

    epoch_seen: int
    addrs: tuple[str, ...] = ()

    type = MsgType.QUERY


@dataclass(frozen=True)
class Announce:
    """The leader's claim: epoch, where its store listens, and the job's state."""

    epoch: int
    store_ip: str
    store_port: int
    round: int = 0
    members: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    closed: bool = False

    type = MsgType.ANNOUNCE


@dataclass(frozen=True)
class Resign:
    """The leader of ``epoch`` steps down (its job closed or it is shutting down)."""

    epoch: int

    type = MsgType.RESIGN


@dataclass(frozen=True)
class Probe:
    """Asks which jobs are here (``python -m torch_mingle ls``): every leader answers, whatever its job."""

    type = MsgType.PROBE


PROBE_JOB = "*"

Body = Query | Announce | Resign | Probe


@dataclass(frozen=True)
class Datagram:
    job: str
    sender: int
    body: Body
    sent_ms: int = 0
    nonce: int = 0


@dataclass(frozen=True)
class Invalid:
    """Why a datagram was dropped; ``reason`` is a short stable token used as a counter key."""

    reason: str


class _Bad(Exception):
    """Internal: carries the drop reason out of the parsing helpers."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _encode_addr(addr: str) -> bytes:
    text, _, scope = addr.partition("%")
    ip = ipaddress.ip_address(text)
    if ip.version == 4:
        return bytes([4]) + ip.packed
    return bytes([6]) + ip.packed + _SCOPE.pack(int(scope) if scope.isdigit() else 0)


def _decode_addr(buf: bytes, pos: int) -> tuple[str, int]:
    if pos >= len(buf):
        raise _Bad("truncated_addr")
    family = buf[pos]
    if family == 4:
        end = pos + 5
        if end > len(buf):
            raise _Bad("truncated_addr")
        return str(ipaddress.IPv4Address(buf[pos + 1 : end])), end
    if family == 6:
        end = pos + 21
        if end > len(buf):
            raise _Bad("truncated_addr")
        ip = str(ipaddress.IPv6Address(buf[pos + 1 : pos + 17]))
        (scope,) = _SCOPE.unpack_from(buf, pos + 17)
        return (f"{ip}%{scope}" if scope else ip), end
    raise _Bad("bad_addr_family")


def _encode_body(body: Body) -> bytes:
    if isinstance(body, Query):
        addrs = body.addrs[:MAX_ADDRS]
        return _QUERY.pack(body.epoch_seen, len(addrs)) + b"".join(_encode_addr(a) for a in addrs)
    if isinstance(body, Announce):
        flags = ANNOUNCE_CLOSED if body.closed else 0
        return (
            _ANNOUNCE.pack(
                body.epoch,
                min(body.round, U32_MAX),
                min(body.members, U16_MAX),
                min(body.min_nodes, U16_MAX),
                min(body.max_nodes, U16_MAX),
                flags,
            )
            + _encode_addr(body.store_ip)
            + _PORT.pack(body.store_port)
        )
    if isinstance(body, Resign):
        return _RESIGN.pack(body.epoch)
    return b""


def _decode_body(kind: int, buf: bytes) -> Body:
    if kind == MsgType.QUERY:
        if len(buf) < _QUERY.size:
            raise _Bad("truncated_body")
        epoch_seen, count = _QUERY.unpack_from(buf)
        if count > MAX_ADDRS:
            raise _Bad("too_many_addrs")
        pos = _QUERY.size
        addrs = []
        for _ in range(count):
            addr, pos = _decode_addr(buf, pos)
            addrs.append(addr)
        if pos != len(buf):
            raise _Bad("body_length_mismatch")
        return Query(epoch_seen=epoch_seen, addrs=tuple(addrs))
    if kind == MsgType.ANNOUNCE:
        if len(buf) < _ANNOUNCE.size:
            raise _Bad("truncated_body")
        epoch, rnd, members, min_nodes, max_nodes, flags = _ANNOUNCE.unpack_from(buf)
        ip, pos = _decode_addr(buf, _ANNOUNCE.size)
        if pos + _PORT.size != len(buf):
            raise _Bad("body_length_mismatch")
        (port,) = _PORT.unpack_from(buf, pos)
        if port == 0 or epoch == 0:
            raise _Bad("bad_field")
        return Announce(
            epoch=epoch,
            store_ip=ip,
            store_port=port,
            round=rnd,
            members=members,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            closed=bool(flags & ANNOUNCE_CLOSED),
        )
    if kind == MsgType.RESIGN:
        if len(buf) != _RESIGN.size:
            raise _Bad("body_length_mismatch")
        (epoch,) = _RESIGN.unpack(buf)
        return Resign(epoch=epoch)
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
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()

    @property
    def authenticated(self) -> bool:
        return self.key is not None

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
        except _Bad as bad:
            return Invalid(bad.reason)
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
        if version != VERSION:
            raise _Bad("bad_version")
        if kind not in MsgType.__members__.values():
            raise _Bad("bad_type")
        if flags & ~FLAG_TAG:
            raise _Bad("bad_flags")
        pos = _HEAD.size
        if job_len == 0 or pos + job_len + _IDS.size > len(data):
            raise _Bad("truncated_header")
        job_bytes = data[pos : pos + job_len]
        pos += job_len
        sender, sent_ms, nonce, body_len = _IDS.unpack_from(data, pos)
        pos += _IDS.size
        tag_len = TAG_BYTES if flags & FLAG_TAG else 0
        if pos + body_len + tag_len != len(data):
            raise _Bad("length_mismatch")
        if self.key is not None:
            if not tag_len:
                raise _Bad("missing_tag")
            expected = hmac.new(self.key, data[: pos + body_len], hashlib.sha256).digest()
            if not hmac.compare_digest(expected, data[pos + body_len :]):
                raise _Bad("bad_tag")
        elif tag_len:
            raise _Bad("unexpected_tag")
        if sender == 0:
            raise _Bad("bad_sender")
        try:
            job = job_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad("bad_job") from None
        body = _decode_body(kind, data[pos : pos + body_len])
        if self.key is not None and wall_ms is not None:
            self._check_replay(sender, sent_ms, nonce, wall_ms)
        return Datagram(job=job, sender=sender, body=body, sent_ms=sent_ms, nonce=nonce)

    def _check_replay(self, sender: int, sent_ms: int, nonce: int, wall_ms: int) -> None:
        if abs(wall_ms - sent_ms) > self.replay_window_ms:
            raise _Bad("outside_replay_window")
        key = (sender, nonce)
        if key in self._seen:
            raise _Bad("replayed")
        self._seen[key] = None
        if len(self._seen) > MAX_REMEMBERED_NONCES:
            self._seen.popitem(last=False)
