"""When the agent is cut loose from its round's store, and which connections.

torch's agent may sit in a TCPStore call on its round's store. A frozen store never answers
(TCPStore's own timeouts do not cover it: docs/faults.md), and a store whose round cannot
start waits for keys its failed members never write. The node cuts the agent's connections
to those stores instead (``Ready.cuts``): to a lost leader's round stores, and to the round's
store when the job failed while the round runs. It remembers the stores of the rounds each
leader gave it: the leader keeps those of its last ``ROUND_STORES_KEPT`` rounds (and opens the
next), so older ones are gone and nothing of the agent's is left in them to cut.
"""

from __future__ import annotations

from torch_mingle._claims import Claim
from torch_mingle._ports import ROUND_STORES_KEPT
from torch_mingle._ready import Ready
from torch_mingle._records import Round, Status

#: Leaders whose round stores a node remembers.
MAX_LEADERS_KEPT = 4


class StoreCuts:
    def __init__(self) -> None:
        self._ports: dict[Claim, list[int]] = {}
        #: The leader's address as this node last reached it (its stores' host).
        self.leader_ip: str | None = None
        #: The round whose store was cut because the job failed (once per round).
        self._failure_cut = 0

    def joined(self, claim: Claim, ip: str, store_port: int) -> None:
        """A round of ``claim``'s leader at ``ip``, on ``store_port``: cut if that leader is lost."""
        self.leader_ip = ip
        ports = self._ports.setdefault(claim, [])
        ports.append(store_port)
        del ports[: -(ROUND_STORES_KEPT + 1)]
        if len(self._ports) > MAX_LEADERS_KEPT:
            self._ports.pop(next(iter(self._ports)))

    def remembered(self) -> int:
        """How many round stores it remembers (bounded: the swarm's ``resources``)."""
        return sum(map(len, self._ports.values()))

    def leader_lost(self, out: Ready, claim: Claim) -> None:
        """``claim``'s leader is lost while the agent runs its round: cut it loose for good."""
        ports = self._ports.get(claim, [])
        if ports and self.leader_ip:
            out.abort_connections_to(self.leader_ip, ports, ended=True)

    def round_failed(self, out: Ready, rnd: Round | None, status: Status | None, own_ip: str | None) -> None:
        """The job failed while the agent runs ``rnd`` (a member's data path check): its workers
        must stop; its store then says why (``AgentStore``), and ``nodes_waiting()`` asks for the
        rest. ``own_ip``: where this node's agent reaches its own stores, leading (else None)."""
        if rnd is None or self._failure_cut == rnd.number:
            return
        if status is None or not status.failure or status.epoch != rnd.epoch:
            return
        self._failure_cut = rnd.number
        ip = own_ip if own_ip is not None else self.leader_ip
        if ip:
            out.abort_connections_to(ip, [rnd.store_port], ended=True)
