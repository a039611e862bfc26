"""A stream's output queue (``_outbox.Outbox``): frames leave whole and in order, never copied."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_mingle._outbox import SEND_CHUNKS, Outbox


class _Sock:
    """A non-blocking socket's sending side: takes at most ``room`` bytes in all (then would
    block), and records the buffers each call was offered."""

    def __init__(self, room: int = 1 << 30) -> None:
        self.room = room
        self.got = bytearray()
        self.calls: list[list[bytes | memoryview]] = []

    def send(self, buf: bytes | memoryview) -> int:
        return self._take([buf])

    def sendmsg(self, bufs: list[bytes | memoryview]) -> int:
        return self._take(list(bufs))

    def _take(self, bufs: list[bytes | memoryview]) -> int:
        self.calls.append(bufs)
        if not self.room:
            raise BlockingIOError
        data = b"".join(bytes(b) for b in bufs)[: self.room]
        self.room -= len(data)
        self.got += data
        return len(data)


def _queued(out: Outbox) -> bytes:
    return b"".join(bytes(c) for c in out.chunks())


def test_a_send_that_ends_inside_a_chunk_leaves_a_view_of_the_rest_of_that_same_frame():
    first, second, third = b"abc", b"defgh", b"ij"
    out = Outbox()
    for frame in (first, second, third):
        out.push(frame)
    sock = _Sock(room=4)
    assert out.send_to(sock) == 4  # abc and d: across the first chunk's end
    assert sock.calls[0][0] is first  # offered as handed over
    head, rest = out.chunks()
    assert isinstance(head, memoryview) and head.obj is second and bytes(head) == b"efgh"
    assert rest is third and out.queued == 6
    sock.room = 4  # e f g h: exactly to the chunk's end
    assert out.send_to(sock) == 4
    assert out.chunks() == (third,)
    sock.room = 100
    assert out.send_to(sock) == 2 and not out and out.queued == 0
    assert bytes(sock.got) == b"abcdefghij"


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(st.binary(min_size=0, max_size=40), max_size=2 * SEND_CHUNKS + 5),
    rooms=st.lists(st.integers(min_value=0, max_value=90), min_size=1, max_size=30),
)
def test_whatever_the_kernel_takes_each_time_the_bytes_leave_once_in_order(frames, rooms):
    out = Outbox()
    for frame in frames:
        out.push(frame)
    expected = b"".join(frames)
    assert out.queued == len(expected)
    sock = _Sock(room=0)
    for room in rooms:
        sock.room = room
        before = out.queued
        sent = out.send_to(sock)
        assert sent == min(room, before) and out.queued == before - sent
        assert bytes(sock.got) + _queued(out) == expected
        assert all(len(c) for c in out.chunks())  # no empty chunk stays queued
    sock.room = len(expected)
    out.send_to(sock)
    assert bytes(sock.got) == expected and not out
    assert all(len(bufs) <= SEND_CHUNKS for bufs in sock.calls)


def test_more_chunks_than_one_sendmsg_gathers_leave_in_one_call_to_send_to():
    out = Outbox()
    frames = [bytes([i]) * 3 for i in range(3 * SEND_CHUNKS + 1)]
    for frame in frames:
        out.push(frame)
    sock = _Sock()
    assert out.send_to(sock) == 3 * len(frames)
    assert bytes(sock.got) == b"".join(frames)
    assert [len(bufs) for bufs in sock.calls] == [SEND_CHUNKS, SEND_CHUNKS, SEND_CHUNKS, 1]


def test_a_frame_queued_on_many_streams_is_one_object_and_a_mutable_buffer_is_copied():
    frame = b"m" * 100_000
    boxes = [Outbox() for _ in range(50)]
    for out in boxes:
        out.push(frame)
    assert all(out.chunks()[0] is frame for out in boxes)
    for i, out in enumerate(boxes):  # partly sent: still a view of that one frame
        out.advance(i + 1)
        (head,) = out.chunks()
        assert isinstance(head, memoryview) and head.obj is frame and len(head) == len(frame) - i - 1
    buf = bytearray(b"abc")
    out = Outbox()
    out.push(buf)  # type: ignore[arg-type]  # a misuse, made harmless
    buf[0] = ord("x")
    assert _queued(out) == b"abc"


def test_advancing_past_what_is_queued_is_a_bug_that_raises():
    out = Outbox()
    out.push(b"ab")
    with pytest.raises(ValueError, match="advance"):
        out.advance(3)
    with pytest.raises(ValueError, match="advance"):
        out.advance(-1)
    assert out.queued == 2


def test_a_send_that_would_block_sends_nothing_and_keeps_the_queue():
    out = Outbox()
    out.push(b"abc")
    out.push(b"de")
    assert out.send_to(_Sock(room=0)) == 0
    assert out.chunks() == (b"abc", b"de") and out.queued == 5
