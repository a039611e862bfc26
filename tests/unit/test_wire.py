"""The datagram codec: round trips, and garbage that never raises and is never accepted."""

from __future__ import annotations

import contextlib
import socket
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_mingle import _loop, _wire
from torch_mingle._frames import Challenge, LeaderFrame, NodeFrame, from_leader_stream, from_node
from torch_mingle._records import MAX_HEARD
from torch_mingle._wire import (
    DUPLICATE_WINDOW_MS,
    EPOCH_MAX,
    MAX_DATAGRAM_BYTES,
    VERSION,
    Announce,
    Codec,
    Datagram,
    Framed,
    FrameReader,
    Invalid,
    Probe,
    Query,
    Resign,
    deflated,
    encode_frame,
    inflated,
    with_scope_of,
)

KEY = b"k" * 32
NOW_MS = 1_700_000_000_000

BODIES = [
    Query(epoch_seen=3, addrs=("198.18.0.1", "fd00::5", "fe80::1")),
    Query(epoch_seen=EPOCH_MAX),
    Query(
        epoch_seen=3, addrs=("198.18.0.1",), round_seen=((3, 0xA, 9), (2, 0xC, 9), (1, 2**64 - 1, 2**32 - 1))
    ),
    Announce(epoch=7, store_ip="127.0.0.1", store_port=29500, round=4, members=3, min_nodes=2, max_nodes=4),
    Announce(
        epoch=7,
        store_ip="fd00::7",
        store_port=29500,
        round=4,
        heard=((7, 0xB, 4), (6, 0xB, 3), (1, 1, 1), (1, 2, 1)),
    ),
    Announce(epoch=2**40, store_ip="2001:db8::1", store_port=1, closed=True, established=True, followers=512),
    # A job closed as failed says so (swarm seed 2708: a spare that heard only this exited 0).
    Announce(epoch=3, store_ip="198.18.0.2", store_port=29500, round=2, closed=True, failed=True),
    Resign(epoch=9),
    # A resignation says what its node heard (swarm seed 62014562: a late node's only word of the job).
    Resign(epoch=2, heard=((2, 0xC, 3), (1, 0xA, 1))),
    # A round heard of says its line where its sayer knew it.
    Resign(epoch=2, heard=((2, 0xC, 3, 2, 0xC, 2), (1, 0xA, 1))),
    Probe(),
]


def dgram(body, job="job42", sender=0x1234, nonce=1):
    return Datagram(job=job, sender=sender, body=body, sent_ms=NOW_MS, nonce=nonce)


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("key", [None, KEY])
def test_round_trip(body, key):
    codec = Codec(key)
    data = codec.encode(dgram(body))
    assert len(data) <= MAX_DATAGRAM_BYTES
    assert Codec(key).decode(data, wall_ms=NOW_MS) == dgram(body)


def test_job_label_travels():
    data = Codec().encode(dgram(Resign(epoch=1), job="ünïcode-job"))
    decoded = Codec().decode(data)
    assert isinstance(decoded, Datagram)
    assert decoded.job == "ünïcode-job"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: b"XXXX" + d[4:], "bad_magic"),
        (lambda d: d[:4] + bytes([VERSION + 1]) + d[5:], "bad_version"),
        (lambda d: d[:5] + b"\x63" + d[6:], "bad_type"),
        (lambda d: d[:3], "too_short"),
        (lambda d: d[:-1], "length_mismatch"),
        (lambda d: d + b"\x00", "length_mismatch"),
        (lambda d: d + b"\x00" * MAX_DATAGRAM_BYTES, "too_long"),
    ],
)
def test_malformed_is_invalid_with_a_reason(mutate, reason):
    data = Codec().encode(dgram(BODIES[0]))
    assert Codec().decode(mutate(data)) == Invalid(reason)


def test_tag_is_required_and_checked():
    plain = Codec().encode(dgram(BODIES[2]))
    signed = Codec(KEY).encode(dgram(BODIES[2]))
    assert Codec(KEY).decode(plain, wall_ms=NOW_MS) == Invalid("missing_tag")
    assert Codec(b"other-key").decode(signed, wall_ms=NOW_MS) == Invalid("bad_tag")
    assert Codec().decode(signed) == Invalid("unexpected_tag")


def test_a_drop_names_the_job_its_header_names_and_an_unsigned_probe_is_its_own_reason():
    """A node tells 'my job, another secret' from noise; ``ls`` without a secret is no fault."""
    signed = Codec(KEY).encode(dgram(BODIES[2]))
    assert Codec(b"other-key").decode(signed, wall_ms=NOW_MS).job == dgram(BODIES[2]).job
    old = bytearray(Codec().encode(dgram(BODIES[2])))
    old[4] = VERSION - 1
    assert Codec().decode(bytes(old)) == Invalid("bad_version")
    assert Codec().decode(bytes(old)).job == dgram(BODIES[2]).job
    probe = Codec().encode(Datagram(job="*", sender=7, body=Probe()))
    assert Codec(KEY).decode(probe, wall_ms=NOW_MS) == Invalid("unsigned_probe")


def test_replay_is_rejected_with_a_key_and_a_second_copy_at_once_is_a_duplicate():
    codec = Codec(KEY)
    data = Codec(KEY).encode(dgram(BODIES[2], nonce=77))
    assert isinstance(codec.decode(data, wall_ms=NOW_MS), Datagram)
    # Several interfaces, broadcast and peers= deliver the same datagram more than once.
    assert codec.decode(data, wall_ms=NOW_MS + 5) == Invalid("duplicate")
    assert codec.decode(data, wall_ms=NOW_MS + DUPLICATE_WINDOW_MS + 1) == Invalid("replayed")
    late = NOW_MS + codec.replay_window_ms + 1
    fresh = Codec(KEY).encode(dgram(BODIES[2], nonce=78))
    assert codec.decode(fresh, wall_ms=late) == Invalid("outside_replay_window")
    # Authentic, only sent at another clock's time: what it says of the job is kept aside
    # (a node founds no job of its own beside a leader whose clock jumped); a forgery's is not.
    stale = codec.decode(fresh, wall_ms=late)
    assert isinstance(stale, Invalid) and stale.stale == dgram(BODIES[2], nonce=78)
    forged = fresh[:-1] + bytes([fresh[-1] ^ 1])
    assert Codec(KEY).decode(forged, wall_ms=late) == Invalid("bad_tag")
    assert Codec(KEY).decode(forged, wall_ms=late).stale is None  # type: ignore[union-attr]


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=MAX_DATAGRAM_BYTES + 64))
def test_random_bytes_never_raise(data):
    for codec in (Codec(), Codec(KEY)):
        out = codec.decode(data, wall_ms=NOW_MS)
        assert isinstance(out, Datagram | Invalid)
        if codec.key is not None:
            assert isinstance(out, Invalid)  # nobody forges HMAC-SHA256 at random


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(BODIES), st.data())
def test_truncations_and_bit_flips_never_raise_nor_pass_the_tag(body, data):
    original = Codec(KEY).encode(dgram(body))
    cut = data.draw(st.integers(min_value=0, max_value=len(original) - 1))
    assert isinstance(Codec(KEY).decode(original[:cut], wall_ms=NOW_MS), Invalid)
    flipped = bytearray(original)
    pos = data.draw(st.integers(min_value=0, max_value=len(original) - 1))
    flipped[pos] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    assert isinstance(Codec(KEY).decode(bytes(flipped), wall_ms=NOW_MS), Invalid)
    # Without a key there is no tag: a flip may still decode, but must never raise.
    plain = bytearray(Codec().encode(dgram(body)))
    plain[pos % len(plain)] ^= 0xFF
    assert isinstance(Codec().decode(bytes(plain)), Datagram | Invalid)


def test_epochs_beyond_the_bound_are_invalid():
    too_far = Codec().encode(dgram(Announce(epoch=EPOCH_MAX, store_ip="10.0.0.1", store_port=1)))
    assert isinstance(Codec().decode(too_far), Datagram)
    data = bytearray(too_far)
    # The announce's epoch is the body's first 8 bytes: make it EPOCH_MAX + 1.
    body_at = len(data) - (8 + 4 + 2 * 3 + 1 + 5 + 2)
    data[body_at : body_at + 8] = (EPOCH_MAX + 1).to_bytes(8, "big")
    assert Codec().decode(bytes(data)) == Invalid("bad_epoch")


def test_a_link_local_address_gets_the_receivers_scope():
    assert with_scope_of("fe80::1", ("fe80::2%eth1", 29477, 0, 3)) == "fe80::1%eth1"
    known = dict(_wire.SCOPE_NAMES)
    _wire.SCOPE_NAMES.clear()
    try:
        assert with_scope_of("fe80::1%7", ("fe80::2", 29477, 0, 1)) == "fe80::1%1"  # no name known: the index
        _wire.SCOPE_NAMES[1] = "lo"  # what the shell fills in (``_assembly``)
        assert with_scope_of("fe80::1%7", ("fe80::2", 29477, 0, 1)) == "fe80::1%lo"  # index 1: loopback
    finally:
        _wire.SCOPE_NAMES.clear()
        _wire.SCOPE_NAMES.update(known)
    assert with_scope_of("fe80::1", ("fe80::2", 29477, 0, 99999)) == "fe80::1%99999"
    assert with_scope_of("fd00::1", ("fe80::2%eth1", 29477, 0, 3)) == "fd00::1"
    assert with_scope_of("10.0.0.1", ("10.0.0.2", 1)) == "10.0.0.1"


def test_control_frames_round_trip_in_pieces():
    stream = encode_frame("hello", node="00ff", epoch=3, leader="0a", ip="10.0.0.1") + encode_frame("hb")
    reader = FrameReader(dict)
    got: list[Framed] = []
    for i in range(len(stream)):  # one byte at a time: a slow writer
        out = reader.feed(stream[i : i + 1])
        assert isinstance(out, list)
        got.extend(out)
    assert [m.frame["t"] for m in got] == ["hello", "hb"]  # type: ignore[index]
    assert reader.pending == 0


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ((10**9).to_bytes(4, "big"), "frame_too_long"),
        (b"\x00\x00\x00\x03abc", "bad_json"),
        (b"\x00\x00\x00\x02[]", "not_an_object"),
    ],
)
def test_garbage_on_the_control_stream_is_invalid(data, reason):
    assert FrameReader(from_node).feed(data) == Invalid(reason)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=4096))
def test_random_stream_bytes_never_raise(data):
    for decode, kinds in (
        (from_node, NodeFrame | Invalid),
        (from_leader_stream, LeaderFrame | Challenge | Invalid),
    ):
        out = FrameReader(decode).feed(data)
        assert isinstance(out, list | Invalid)
        if isinstance(out, list):
            for framed in out:
                assert isinstance(framed.frame, kinds)
                assert isinstance(framed.raw, bytes)


def test_a_heartbeat_read_without_the_json_decoder_is_the_frame_the_decoder_gives():
    hb, other = encode_frame("hb"), encode_frame("hb", x=1)  # only the exact heartbeat is short-cut
    for decode in (from_node, from_leader_stream):
        got = FrameReader(decode).feed(hb + other + hb)
        beat, odd = Framed(decode({"t": "hb"}), hb[4:]), Framed(decode({"t": "hb", "x": 1}), other[4:])
        assert got == [beat, odd, beat]


def test_a_control_socket_retransmits_quickly_where_the_kernel_can():
    """Linear timeouts and a 20 ms RTO floor keep a lost heartbeat from holding the stream up
    past the heartbeat timeout (benchmarks/lossy_heartbeats.py measures it); an option the
    kernel does not know is skipped, not an error."""
    with socket.socket() as sock:
        _loop.tune_control_socket(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        if not sys.platform.startswith("linux"):
            return
        assert sock.getsockopt(socket.IPPROTO_TCP, _loop.TCP_THIN_LINEAR_TIMEOUTS) == 1
        for option, value in ((_loop.TCP_RTO_MIN_US, _loop.CONTROL_RTO_MIN_US), (_loop.TCP_RTO_MAX_MS, 1000)):
            try:
                current = sock.getsockopt(socket.IPPROTO_TCP, option)
            except OSError:
                continue  # an older kernel: Linux's own floor and ceiling
            assert current == value


@given(st.binary(max_size=4096))
def test_deflated_bytes_come_back_and_garbage_is_a_value_error(data):
    assert inflated(deflated(data), len(data)) == data
    with pytest.raises(ValueError, match="inflated"):
        inflated(deflated(data + b"x"), len(data))
    with contextlib.suppress(ValueError):  # anything but deflated text is refused, nothing else raises
        inflated(data.decode("latin-1"), 1 << 20)
    with pytest.raises(TypeError):
        inflated(data, 1 << 20)


def test_the_largest_datagram_fits():
    """Every field at its largest (a 255-byte job, ``MAX_ADDRS`` IPv6 addresses,
    ``MAX_KEYS`` rounds heard of, each with its line, a tag) fits in ``MAX_DATAGRAM_BYTES``:
    what a node heard of travels whole (``_records.MAX_HEARD``)."""
    keys = tuple(
        (EPOCH_MAX - i, 2**63 + i, 2**31 + i, EPOCH_MAX - i, 2**63 + i, 2**31) for i in range(_wire.MAX_KEYS)
    )
    addrs = tuple(f"fd00:{i + 1:x}:1234:5678:9abc:def0:1234:5678" for i in range(_wire.MAX_ADDRS))
    bodies = [
        Query(epoch_seen=EPOCH_MAX, addrs=addrs, round_seen=keys),
        Announce(epoch=EPOCH_MAX, store_ip="fd00:1:2:3:4:5:6:7", store_port=65535, round=2**31, heard=keys),
        Resign(epoch=EPOCH_MAX, heard=keys),
    ]
    assert _wire.MAX_KEYS == MAX_HEARD
    for body in bodies:
        data = Codec(KEY).encode(dgram(body, job="j" * 255))
        assert len(data) <= MAX_DATAGRAM_BYTES
        assert Codec(KEY).decode(data, wall_ms=NOW_MS) == dgram(body, job="j" * 255)
