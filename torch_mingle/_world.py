"""The world a round's workers start in: the rules on torch's rank exchange.

Right after ``next_rendezvous()`` returns, torch's agent writes its role info under
``ROLE_INFO_PREFIX`` in the round's store, rank 0 reads every member's and writes the ranks it
assigns under ``ASSIGNED_RANKS_PREFIX``, and every agent reads its own
(``SimpleElasticAgent._assign_worker_ranks``). Two rules keep a worker in its round's world:

* a round that broke before every member wrote (a member lost in that window) is answered with
  stand-ins (``stand_in``): this agent's own role info, and ranks in a world of the round's
  size, as if every member ran as many workers as it does; never a world of this agent alone;
* whatever torch computes, ranks that put this agent's workers in a world smaller than the
  round's, or outside it, are refused (``checked``): its workers never start;
* a call of the exchange that fails on the round's store is the round breaking only once the
  node says so, and the node is given ``store_error_wait_s`` to say it: a reset (a firewall
  blip, a lost leader) reaches the store's client at once, the node's word a little later.
  Failing at once would end the agent, and close the job, for a round that only broke.

Pure (``_store.AgentStore`` applies them on the agent's thread; the simulator's agents can too).
"""

from __future__ import annotations

import json

from torch_mingle._errors import StateError

ROLE_INFO_PREFIX = "torchelastic/role_info/"
ASSIGNED_RANKS_PREFIX = "torchelastic/assigned_ranks/"
RANK_KEYS = (ROLE_INFO_PREFIX, ASSIGNED_RANKS_PREFIX)
#: How much longer than the node's heartbeat timeout a failed store call waits for its word.
STORE_ERROR_SLACK_S = 1.0

#: What an agent that wrote no role info yet stands in with.
DEFAULT_ROLE = b'{"role": "default", "rank": 0, "local_world_size": 1}'


def stand_in(key: str, own_role: bytes | None, world_size: int) -> bytes:
    """What an agent reads for rank key ``key`` of a round of ``world_size`` nodes that broke:
    its own role info, and ranks in the round's world."""
    own = own_role or DEFAULT_ROLE
    if key.startswith(ROLE_INFO_PREFIX):
        return own
    info = json.loads(own)
    size, rank = int(info.get("local_world_size", 1)), int(key.rpartition("/")[2] or 0)
    world = world_size * size
    return json.dumps([rank * size, world, rank * size, world]).encode()


def store_error_wait_s(heartbeat_timeout_s: float) -> float:
    """How long a call of the rank exchange that failed on the round's store waits for the node
    to say that the round broke (then it goes on as in a broken round) before the agent fails:
    whatever cut the store off cut its control connection too, and the node notices that
    within its heartbeat timeout."""
    return heartbeat_timeout_s + STORE_ERROR_SLACK_S


#: A wait for the node's word looks at the node this often; a longer gap between two looks is
#: a process that was stopped (SIGSTOP, a stall), and counts as one look (``ran_s``).
RUN_SLICE_S = 0.1


def ran_s(elapsed_s: float) -> float:
    """How much of ``elapsed_s`` since a wait's last look counts toward ``store_error_wait_s``:
    all of it, but for a gap that only a stopped process has (then one slice): the node,
    stopped with it, could not say anything meanwhile, and gets its time after the thaw."""
    return elapsed_s if elapsed_s <= 2 * RUN_SLICE_S else RUN_SLICE_S


def checked(key: str, value: bytes, own_role: bytes | None, world_size: int) -> bytes:
    """``value`` of a rank key, unless the ranks it assigns put this agent's workers in a world
    smaller than the round's (each of its ``world_size`` nodes runs one worker at least), or
    outside it: then ``StateError``, instead of workers in a world of their own."""
    if not key.startswith(ASSIGNED_RANKS_PREFIX):
        return value
    try:
        base, world, _role_base, _role_world = json.loads(value)
        base, world = int(base), int(world)
    except (ValueError, TypeError) as exc:
        raise StateError(f"{key} holds {value!r}, not torch's assigned ranks") from exc
    own = json.loads(own_role) if own_role else {}
    local = int(own.get("local_world_size", 1))
    if world < world_size or not 0 <= base <= world - local:
        raise StateError(
            f"{key} puts this agent's {local} worker(s) at rank {base} of a world of {world}, but "
            f"its round has {world_size} nodes: its workers would train in a world of their "
            "own. This is a bug in torch_mingle; please report it with the agents' logs"
        )
    return value
