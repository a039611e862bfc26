"""What the parts of a node tell of the rendezvous: ``Note``s, recorded as torch's events by
the agent's thread (``_events``), so that the parts themselves import nothing of torch."""

from __future__ import annotations

from collections.abc import Callable

from torch_mingle._record import record

#: Notes the loop may post before the agent's thread records them; older ones are dropped.
MAX_PENDING_NOTES = 1024


@record
class Note:
    """One rendezvous event, as the node saw it."""

    name: str
    message: str
    #: torch's ``NodeState`` by name: INIT, RUNNING, SUCCEEDED or FAILED.
    state: str = "RUNNING"
    rank: int | None = None
    #: ``host:port`` of the round's store, where known.
    master_endpoint: str = ""


#: Where the parts of a node put their notes.
Sink = Callable[[Note], None]


def ignore(note: Note) -> None:
    """The sink of a part nobody listens to."""
