"""What one stream still has to send, queued without copying (``Outbox``), and the socket
calls it needs (``Sender``): the loop's write path, apart so that it can be tested alone."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Protocol

#: Chunks one ``sendmsg`` gathers at most (Linux's IOV_MAX is 1024): a queue of small frames
#: leaves in one call, and the list built for it stays short.
SEND_CHUNKS = 64


class Sender(Protocol):
    """The sending side of a non-blocking stream socket (``socket.socket``; a fake in tests)."""

    def send(self, data: bytes | memoryview, /) -> int: ...
    def sendmsg(self, buffers: list[bytes | memoryview], /) -> int: ...


class Outbox:
    """What one stream still has to send: the frames as they were handed over, never copied.

    A frame that goes to many connections (a round's ``members``, a heartbeat, a status) is
    one ``bytes`` object in every queue that holds it; a partly sent frame stays as a
    ``memoryview`` of what is left of it. Invariants: no chunk is empty, every chunk is
    immutable, and ``queued`` is the sum of the chunks' lengths (what ``MAX_OUTPUT_BYTES``
    counts).
    """

    __slots__ = ("_chunks", "queued")

    def __init__(self) -> None:
        self._chunks: deque[bytes | memoryview] = deque()
        self.queued = 0

    def __bool__(self) -> bool:
        return self.queued > 0

    def __repr__(self) -> str:
        return f"Outbox({len(self._chunks)} chunks, {self.queued} bytes)"

    def push(self, data: bytes) -> None:
        """Queue ``data`` as it is (a mutable buffer is copied: it could change while queued)."""
        if not data:
            return
        if type(data) is not bytes:
            data = bytes(data)
        self._chunks.append(data)
        self.queued += len(data)

    def head(self) -> tuple[list[bytes | memoryview], int]:
        """The first chunks (``SEND_CHUNKS`` at most), and how many bytes they hold."""
        chunks = list(itertools.islice(self._chunks, SEND_CHUNKS))
        return chunks, sum(map(len, chunks))

    def chunks(self) -> tuple[bytes | memoryview, ...]:
        """Every queued chunk, in order (for tests and diagnostics)."""
        return tuple(self._chunks)

    def advance(self, sent: int) -> None:
        """``sent`` bytes from the front went out (at most ``queued``)."""
        if not 0 <= sent <= self.queued:
            raise ValueError(f"advance({sent}) with {self.queued} bytes queued")
        self.queued -= sent
        chunks = self._chunks
        while sent:
            size = len(chunks[0])
            if sent < size:
                chunks[0] = memoryview(chunks[0])[sent:]
                return
            sent -= size
            chunks.popleft()

    def send_to(self, sock: Sender) -> int:
        """Send from the front until the queue is empty or the kernel takes no more (a short
        send, or none); the bytes that went. OS errors other than would-block raise."""
        chunks = self._chunks
        total = 0
        while chunks:
            try:
                if len(chunks) == 1:  # the common case (a heartbeat, an answer): no list built
                    offered = len(chunks[0])
                    sent = sock.send(chunks[0])
                else:
                    batch, offered = self.head()
                    sent = sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                break
            self.advance(sent)
            total += sent
            if sent < offered:
                break
        return total
