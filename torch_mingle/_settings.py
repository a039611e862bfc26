"""What one node is told at its start: its job, its id, the job's size, its timings and its
addresses (``NodeSettings``, from the handler's config: ``_assembly``; or the simulator's)."""

from __future__ import annotations

from torch_mingle._record import record

#: What must agree across a job, as (key, value as text) pairs: a node whose terms differ from
#: its leader's is refused (``Mismatch``) and fails at once, naming each difference.
Terms = tuple[tuple[str, str], ...]
#: One difference: (key, the job's value, the node's value).
Difference = tuple[str, str, str]
#: How to fix each key of ``Terms`` (the rest are ``--rdzv_conf`` keys).
_FIX = {"nnodes": "--nnodes", "keep_alive": "--rdzv_conf keep_alive_interval and keep_alive_max_attempt"}


def differences(job: Terms, node: Terms) -> tuple[Difference, ...]:
    """Where ``node``'s terms differ from ``job``'s (a key only one of them says is not compared)."""
    ours = dict(node)
    return tuple((key, value, ours[key]) for key, value in job if key in ours and ours[key] != value)


def describe_differences(diffs: tuple[Difference, ...], node: str = "this node") -> str:
    """The differences as a sentence, each with its fix (the job's settings are its leader's)."""
    said = "; ".join(f"{key} is {mine} on {node} and {theirs} in the job" for key, theirs, mine in diffs)
    fixes = ", ".join(dict.fromkeys(_FIX.get(key, f"--rdzv_conf {key}") for key, _, _ in diffs))
    return (
        f"{node}'s settings differ from the job's (its leader's): {said}. Start every node of the job "
        f"with the same {fixes} (docs/usage.md#settings-every-node-must-share)"
    )


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
    #: What must agree across the job (``Terms``); said in its hello, checked by its leader.
    terms: Terms = ()
