"""The agent's client of the next round's store, opened ahead of the round.

The leader names the store of its next round as soon as it is open (``LeaderTerm.spare_port``,
the ``next`` frame). A node that is not parked opens the agent's client of it at once, on a
worker thread of the shell (``OpenClient``): while its join waits, before the first round, and
while it runs in a round. When the round forms on that very store of that claim, the agent
returns with the client already open, instead of N agents connecting when the round forms.

``StoreAhead`` is what the node keeps of it (sans-I/O): which store it aims at, the client
once it is open, and the connects under way, which are cut if their leader is lost.
"""

from __future__ import annotations

from torch_mingle._claims import Claim
from torch_mingle._jobs import OpenClient
from torch_mingle._record import field, record

#: A store to open a client of: its leader's claim, the leader's address (None: this node's own
#: term, reached on the node's connect address), and its port.
Target = tuple[Claim, str | None, int]


@record(frozen=False)
class StoreAhead:
    target: Target | None = None
    #: The client of ``target`` once it is open (handed over once, ``take``).
    client: object = None
    #: Names the newest connect: one that ends later than a newer one is dropped.
    seq: int = 0
    #: Connects under way, by tag: cut when their leader is lost, current or not.
    pending: dict[int, Target] = field(default_factory=dict)

    def aim(self, target: Target | None) -> tuple[OpenClient, int] | None:
        """Aim at ``target`` (None: at nothing); the connect to start, with its tag, if it changed."""
        if target == self.target:
            return None
        self.target, self.client = target, None
        self.seq += 1
        if target is None:
            return None
        self.pending[self.seq] = target
        return OpenClient(target[1], target[2]), self.seq

    def opened(self, tag: int, client: object, error: str | None) -> None:
        """The connect ``tag`` ended: its client is kept if it is still the one aimed at."""
        self.pending.pop(tag, None)
        if tag == self.seq and self.target is not None and error is None:
            self.client = client  # else dropped: the round it was for is gone

    def take(self, claim: Claim, port: int) -> object:
        """The client opened ahead for this round's store, handed over once (the target stays,
        so the same store is not connected again; ``ready`` is False until the next)."""
        target = self.target
        if target is None or (target[0], target[2]) != (claim, port):
            return None
        client, self.client = self.client, None
        self.seq += 1  # a connect still under way for it is dropped when it ends
        return client

    @property
    def ready(self) -> bool:
        """A client is open, waiting for its round."""
        return self.client is not None

    def toward(self, claim: Claim) -> set[tuple[str, int]]:
        """The stores of ``claim``'s leader (address, port) this node is connecting or connected
        to ahead: to cut when that leader is lost."""
        stores = {(ip, port) for c, ip, port in self.pending.values() if c == claim and ip}
        if self.target is not None and self.target[0] == claim and self.target[1] is not None:
            stores.add((self.target[1], self.target[2]))  # open, waiting for the round
        return stores
