"""A worker never starts at a world size other than its round's (docs/faults.md#the-world-of-a-round).

torch's agent assigns its workers' ranks right after ``next_rendezvous()`` returns, through the
agent store (``AgentStore``). Here the agent's own code does that, on real handlers, real
multicast on 127.0.0.1 and the round's real TCPStore, at the moments that once broke it: the
node's snapshot held back while the round is handed over, and a newcomer waiting while the
round is still whole.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, Worker, WorkerSpec

from tests.helpers import rendezvous_all, unique_job, wait_until
from torch_mingle import _faults

WORKERS_PER_NODE = 2


def _assign_ranks(handler: Any, info: Any) -> list[Worker]:
    """What torch's agent does with a rendezvous' result before it starts the workers."""
    spec = WorkerSpec(role="trainer", local_world_size=WORKERS_PER_NODE, rdzv_handler=handler, entrypoint="x")
    assign = SimpleElasticAgent._assign_worker_ranks  # torch's own rank exchange
    return list(assign(None, info.store, info.rank, info.world_size, spec))


def _assign_on_every_node(handlers: list[Any], infos: list[Any]) -> list[list[Worker]]:
    with ThreadPoolExecutor(len(handlers)) as pool:
        futures = [pool.submit(_assign_ranks, h, i) for h, i in zip(handlers, infos, strict=True)]
        return [f.result(timeout=60) for f in futures]


def _assert_one_world(infos: list[Any], workers: list[list[Worker]]) -> None:
    world = infos[0].world_size * WORKERS_PER_NODE
    assert {w.world_size for node in workers for w in node} == {world}
    assert sorted(w.global_rank for node in workers for w in node) == list(range(world))


def test_ranks_are_the_rounds_while_the_nodes_snapshot_lags_behind_the_round(make_handler):
    """Every snapshot the agents could read is older than their round: the round is not over
    for that (it was: the leader's workers trained alone as rank 0 of a world of their own)."""
    job = unique_job("lag")
    handlers = [make_handler(job, 3) for _ in range(3)]
    _faults.arm("node.publish", times=10**9)  # no snapshot from here on
    infos = rendezvous_all(handlers)
    assert all(h.diagnostics().round == 0 for h in handlers)  # held back indeed
    assert [h.num_nodes_waiting() for h in handlers] == [0, 0, 0]  # a lagging snapshot restarts nothing
    _assert_one_world(infos, _assign_on_every_node(handlers, infos))


def test_ranks_are_the_rounds_while_a_newcomer_waits(make_handler):
    """A node waiting for the next round does not break the running one: every member takes its
    rank (and the agents restart for the newcomer after that, through ``num_nodes_waiting``)."""
    job = unique_job("newcomer")
    first = [make_handler(job, 2, 3, last_call_timeout="0.2") for _ in range(2)]
    infos = rendezvous_all(first)
    newcomer = make_handler(job, 2, 3, last_call_timeout="0.2")
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(newcomer.next_rendezvous)
        try:
            wait_until(lambda: all(h.num_nodes_waiting() > 0 for h in first), 15, "the members to see it")
            _assert_one_world(infos, _assign_on_every_node(first, infos))
            later = rendezvous_all(first)  # what the agents do next: the newcomer is in
            third = joining.result(timeout=30)
        finally:
            if not joining.done():
                newcomer.shutdown()  # its join ends: the test fails instead of waiting
    assert {i.world_size for i in [*later, third]} == {3}
