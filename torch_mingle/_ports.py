"""The TCPStores of a leader's term: the spare one the next round will use, those of its last
rounds, and the retries when one cannot be opened.

A store is opened ahead of its round on the shell's worker thread (``OpenStore``), so a round
forms without waiting for one, and the leader names it to the members that will likely be in
the next round (``next``), who connect to it ahead. The next spare is opened
``NEXT_STORE_DELAY_S`` after a round formed, not at once: a thousand members connecting to it
would compete with the new round's own start. The stores of the last ``ROUND_STORES_KEPT``
rounds stay up (their agents' exit barriers use them); older ones are released. Invariant:
every opened port is the spare, the proposed round's, a kept round's, or released, once.
"""

from __future__ import annotations

import logging

from torch_mingle._jobs import Job, OpenStore, ReleaseStores

log = logging.getLogger(__name__)

ROUND_STORES_KEPT = 2
STORE_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: The next round's store is opened (and offered to every member, who connects to it ahead)
#: this long after a round formed, not at once: a thousand members connecting to it would
#: compete with the new round's own start (its agents and workers connecting to its store,
#: the leader's accept queue). A round needed sooner opens it at once.
NEXT_STORE_DELAY_S = 1.0


class StorePorts:
    def __init__(self) -> None:
        #: Where its jobs for the worker thread go: the term's own list (``LeaderTerm.start``).
        self.jobs: list[Job] = []
        #: The store the next round will use, once open.
        self.spare: int | None = None
        self._requested = False
        #: The stores of the term's last rounds, oldest first.
        self._rounds: list[int] = []
        self._failures = 0
        self._retry_at: float | None = None
        self._spare_due_at: float | None = None

    def request(self, *, stopped: bool) -> None:
        """Open a spare store, unless one is open or on its way."""
        if self.spare is None and not self._requested and not stopped:
            self._requested = True
            self.jobs.append(OpenStore())

    def opened(self, port: int, *, stopped: bool) -> bool:
        """A store opened; False if the term stopped meanwhile (it is released)."""
        self._requested = False
        self._failures = 0
        if stopped:
            self.jobs.append(ReleaseStores(ports=(port,)))
            return False
        self.spare = port
        return True

    def failed(self, error: str, now: float, *, wanted: bool, label: str) -> None:
        """A store could not be opened: retry with backoff; raise (the term resigns) only if a
        round waits for it (``wanted``) and three tries failed."""
        self._requested = False
        self._failures += 1
        hint = "; raise `ulimit -n` (see docs/networks.md#limits)" if "Too many open files" in error else ""
        if wanted and self._failures >= 3:
            raise RuntimeError(f"cannot open a round store ({self._failures} tries): {error}{hint}")
        delay = STORE_RETRY_S[min(self._failures, len(STORE_RETRY_S)) - 1]
        log.warning("%s cannot open a round store: %s%s; trying again in %gs", label, error, hint, delay)
        self._retry_at = now + delay

    def wanted_now(self, *, stopped: bool) -> None:
        """A round waits for a store: open one at once (unless a retry is already due)."""
        self._spare_due_at = None
        if self._retry_at is None:
            self.request(stopped=stopped)

    def take(self) -> int | None:
        """The spare store, for a round to propose on (None: none is open)."""
        port, self.spare = self.spare, None
        return port

    def give_back(self, port: int, *, stopped: bool) -> None:
        """A proposal was withdrawn: its store is the spare again (or released, if there is one)."""
        if self.spare is None and not stopped:
            self.spare = port
        else:
            self.jobs.append(ReleaseStores(ports=(port,)))

    def formed(self, port: int, now: float) -> None:
        """A round formed on ``port``: keep the last rounds' stores, open the next spare soon."""
        self._rounds.append(port)
        old, self._rounds = self._rounds[:-ROUND_STORES_KEPT], self._rounds[-ROUND_STORES_KEPT:]
        if old:
            self.jobs.append(ReleaseStores(ports=tuple(old)))
        self._spare_due_at = now + NEXT_STORE_DELAY_S

    def release_all(self, proposed: int | None) -> None:
        """Stop every store of the term (it stepped down, or its node shut down)."""
        ports = [*self._rounds, *([proposed] if proposed is not None else [])]
        ports += [self.spare] if self.spare is not None else []
        self._rounds, self.spare = [], None
        if ports:
            self.jobs.append(ReleaseStores(ports=tuple(ports)))

    def due(self, now: float, *, stopped: bool) -> None:
        """A retry or the next spare is due."""
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            self.request(stopped=stopped)
        if self._spare_due_at is not None and now >= self._spare_due_at:
            self._spare_due_at = None
            self.request(stopped=stopped)

    def timers(self) -> list[float]:
        return [t for t in (self._retry_at, self._spare_due_at) if t is not None]
