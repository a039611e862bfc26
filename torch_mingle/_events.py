"""torch's rendezvous events, recorded at the points where torch's c10d backend records them.

How it works
------------
torch's elastic package sends every rendezvous event to the logger of its
``dynamic_rendezvous`` destination; a site that wants them installs a handler there
(``torch.distributed.elastic.events.handlers._log_handlers["dynamic_rendezvous"]``), and by
default nothing is recorded. The parts of a node that see an event (the leader's term, the
follower's session, the node, the handler) describe it as a ``Note``. Notes of the loop's
thread go through the ``Board`` to the agent's thread, which records them (``record_notes``), so that
a slow event handler of the site slows the agent, as with c10d, and never the heartbeats.

The events (``Note.name``): ``join``, ``joined``, ``join_failed``, ``keep_alive``,
``last_call``, ``quorum_wait``, ``round_complete``, ``node_lost``, ``leader_elected``,
``leader_found``, ``leader_lost``, ``stepped_down``, ``health_check_failed``, ``set_closed``,
``closed``, ``shutdown``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable

from torch.distributed.elastic.events import NodeState, RdzvEvent, record_rdzv_event
from torch.distributed.elastic.events.handlers import get_logging_handler

from torch_mingle._notes import Note

log = logging.getLogger(__name__)

DESTINATION = "dynamic_rendezvous"


def enabled() -> bool:
    """Whether a site installed a handler for rendezvous events (torch's own test first)."""
    return not isinstance(get_logging_handler(DESTINATION), logging.NullHandler)


def record_notes(notes: Iterable[Note], run_id: str, node: str) -> None:
    """Record ``notes`` as torch's ``RdzvEvent``s of this process (``node``: its node id)."""
    if not enabled():
        return
    hostname, pid = socket.gethostname(), os.getpid()  # not getfqdn: no DNS lookup here
    for note in notes:
        event = RdzvEvent(
            name=f"mingle:{note.name}",
            run_id=run_id,
            message=f"The node '{node}' {note.message}",
            hostname=hostname,
            pid=pid,
            node_state=NodeState[note.state],
            master_endpoint=note.master_endpoint,
            rank=note.rank,
        )
        try:
            record_rdzv_event(event)
        except Exception:  # a site's handler must not break the rendezvous
            log.warning("recording the rendezvous event %s failed", note.name, exc_info=True)
