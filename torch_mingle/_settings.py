"""What one node is told at its start: its job, its id, the job's size, its timings and its
addresses (``NodeSettings``, from the handler's config: ``_assembly``; or the simulator's)."""

from __future__ import annotations

from torch_mingle._record import record


@record
class RoundRules:
    """What a leader's book forms rounds by (``_rounds.RoundBook``): the job's size, how long
    it waits, and its quorum."""

    min_nodes: int
    max_nodes: int
    last_call_timeout_s: float
    rejoin_delay_s: float = 30.0
    #: A round after the first needs a majority of the previous round (``quorum=majority``).
    quorum: bool = True
    #: The first round needs more than half of ``max_nodes`` (``first_round=majority``).
    first_round_majority: bool = False


@record
class Beats:
    """A control connection's heartbeats, both ways every ``interval_s``: silent for
    ``timeout_s`` is lost; ``connect_timeout_s`` bounds a follower's connect."""

    interval_s: float
    timeout_s: float
    connect_timeout_s: float = 0.0


@record
class NodeSettings:
    job: str
    node_id: int
    rules: RoundRules
    beats: Beats
    discovery_warning_s: float
    #: Where a leader listens (an address, or the wildcard with several interfaces) ...
    bind_ip: str
    #: ... and what it announces (the wildcard too: followers then use the source address).
    advertised_ip: str
    label: str
    #: Where this node's agent connects to the stores it hosts as leader (its own address, or
    #: loopback with several interfaces).
    connect_ip: str = ""
    #: This node's data-path probe port (TCP; 0: none), told to the leader with every join.
    probe_port: int = 0
    #: Which process of this node id this is (``_identity``: a restarted agent is the next).
    incarnation: int = 1
    #: Where this node sorts in rank order (``rank_order``, ``_order``); "": arrival order.
    place: str = ""
