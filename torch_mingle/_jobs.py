"""The jobs a node hands its shell's worker thread: blocking TCPStore work, answered by the
input ``WorkDone`` (the leader's term: ``job_done``; the store opened ahead: ``_ahead``)."""

from __future__ import annotations

from torch_mingle._record import record


@record
class OpenStore:
    """Open a fresh TCPStore server; the result is its port."""


@record
class OpenExitBarrier:
    """Mark torch's exit barrier of the round whose store listens on ``port`` as complete."""

    round: int
    port: int


@record
class ReleaseStores:
    """Stop the round stores on these ports."""

    ports: tuple[int, ...]


@record
class OpenClient:
    """Any role: open a client of the store at ``ip:port`` (None: this node's own stores) ahead
    of the round that will use it; the result is the client (see ``Node._connect_ahead``)."""

    ip: str | None
    port: int


Job = OpenStore | OpenExitBarrier | ReleaseStores | OpenClient
