"""Where the agent's thread and the node's loop meet: the ``Board``.

The node runs on the loop's thread and has no lock (``_node``); torch's agent calls the
handler on its own thread. Each request goes to the node with a ``Ticket`` and the agent
waits here until the node resolves it, or its deadline passes; the node publishes a
``Diagnostics`` snapshot here, which the agent reads without asking the loop.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

from torch_mingle import _world
from torch_mingle._errors import StateError
from torch_mingle._notes import MAX_PENDING_NOTES, Note
from torch_mingle._ready import Ticket
from torch_mingle._record import replace
from torch_mingle._view import Diagnostics
from torch_mingle.errors import MingleError, MingleStateError


class Board:
    """Where the loop thread posts results and snapshots, and the agent's thread waits for them."""

    def __init__(self, diagnostics: Diagnostics) -> None:
        # Re-entrant: the SIGTERM hook (``MingleRendezvousHandler.leave``) waits on the board
        # from the agent's main thread, which the signal may interrupt inside a board call.
        lock = threading.RLock()
        # Two conditions on one lock: a snapshot (published a dozen times a second while a
        # round forms) wakes only those who wait for one, not the agent waiting for its answer.
        self._snapshots = threading.Condition(lock)
        self._answers = threading.Condition(lock)
        self._diag = diagnostics
        self.fatal: BaseException | None = None
        #: Rendezvous events of the loop's thread, for the agent's (``_events``): the oldest
        #: go first when the agent records none for long.
        self._notes: deque[Note] = deque(maxlen=MAX_PENDING_NOTES)

    def publish(self, diag: Diagnostics) -> None:
        with self._snapshots:
            if self.fatal is not None:  # a failed loop stays failed, whatever is published late
                diag = replace(diag, loop_alive=False, last_error=str(self.fatal))
            self._diag = diag
            self._snapshots.notify_all()

    def diagnostics(self) -> Diagnostics:
        with self._snapshots:
            return self._diag

    def wait_for(
        self, predicate: Callable[[Diagnostics], bool], timeout_s: float, *, running: bool = False
    ) -> Diagnostics | None:
        """The first snapshot that satisfies ``predicate``, or None after ``timeout_s``.
        ``running``: ``timeout_s`` counts only time this process ran (``_world.ran_s``), so a
        process stopped meanwhile gives its node the time to catch up after the thaw."""
        slice_s = _world.RUN_SLICE_S if running else math.inf
        waited, last = 0.0, time.monotonic()
        with self._snapshots:
            while not predicate(self._diag):
                if waited >= timeout_s or self.fatal is not None:
                    return None
                self._snapshots.wait(min(timeout_s - waited, slice_s))
                now = time.monotonic()
                waited, last = waited + (_world.ran_s(now - last) if running else now - last), now
            return self._diag

    def resolve(self, ticket: Ticket, result: object = None, error: BaseException | None = None) -> None:
        with self._answers:
            if ticket.done:
                return
            ticket.done, ticket.result, ticket.error = True, result, error
            self._answers.notify_all()

    def extend(self, ticket: Ticket, deadline: float | None) -> None:
        with self._answers:
            ticket.deadline = deadline
            self._answers.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._answers:
            self.fatal = exc
            self._diag = replace(self._diag, loop_alive=False, last_error=str(exc))
            self._answers.notify_all()
            self._snapshots.notify_all()

    def post_note(self, note: Note) -> None:
        """A rendezvous event for the agent's thread to record (``_events``); thread-safe."""
        with self._answers:
            self._notes.append(note)
            self._answers.notify_all()

    def take_notes(self) -> list[Note]:
        with self._answers:
            return self._take_notes()

    def _take_notes(self) -> list[Note]:
        notes = list(self._notes)
        self._notes.clear()
        return notes

    def answered_within(self, ticket: Ticket, timeout_s: float) -> bool:
        """Whether ``ticket`` is resolved (or the loop failed) within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._answers:
            while not ticket.done and self.fatal is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._answers.wait(left)
            return True

    def wait(
        self,
        ticket: Ticket,
        *,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_notes: Callable[[list[Note]], None] | None = None,
    ) -> object:
        """Block until the node resolves ``ticket``; every wait has a deadline.

        The node's own deadline (which moves while the node is parked) plus ``grace_s``
        bounds it; a loop that died fails it at once. ``on_notes`` gets the rendezvous events
        posted meanwhile, on this thread and outside the lock.
        """
        while True:
            with self._answers:
                # The answer, the loop's failure and the deadline are read in the same pass as
                # the notes: a handler slower than the notes come never delays them.
                notes = self._take_notes() if on_notes is not None else []
                done, fatal = ticket.done, self.fatal
                limit = None if ticket.deadline is None else ticket.deadline + grace_s
                now = clock()
                if not (notes or done or fatal is not None or (limit is not None and now >= limit)):
                    self._answers.wait(1.0 if limit is None else min(1.0, limit - now))
                    continue
            if notes:
                assert on_notes is not None  # noqa: S101 - notes are taken only for it
                on_notes(notes)
            if done:
                break
            if fatal is not None:
                raise MingleStateError(f"the mingle loop stopped: {fatal}") from fatal
            if limit is not None and now >= limit:
                raise MingleStateError(
                    f"the mingle loop did not answer a {ticket.kind} request within its deadline; "
                    "this is a bug in torch_mingle"
                )
        if isinstance(ticket.error, StateError) and not isinstance(ticket.error, MingleError):
            raise MingleStateError(str(ticket.error)) from ticket.error  # the agent's error family
        if ticket.error is not None:
            raise ticket.error
        return ticket.result
