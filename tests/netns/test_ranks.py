"""Ranks across rounds (docs/usage.md#ranks-across-rounds), with torchrun agents, one per
network namespace: ``--nnodes=4`` and one spare; a member (or the leader) is killed, and the
spare takes the rank the docs say it takes while every survivor keeps its own (or, for the
leader's successor, takes rank 0)."""

from __future__ import annotations

import pytest

from tests.helpers import (
    Agent,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    joins,
    leader_of,
    start_training,
    wait_until,
)

pytestmark = pytest.mark.netns

NODES = 4
STEPS, STEP_S = 100, 0.15


def _ranks(agent: Agent) -> list[tuple[int, int]]:
    """(round, node rank) of every round the agent joined, in order."""
    return [(r, rank) for r, rank, _ in joins(agent)]


def _job_with_a_spare(segment, tmp_path) -> tuple[list[Agent], Agent, dict[str, int]]:
    """The job's agents, its spare, and each member's node rank in round 1, by agent name."""
    hosts = [segment.add_host(f"198.18.0.{20 + i}") for i in range(NODES + 1)]
    agents = start_training(
        hosts, tmp_path, {}, nnodes=str(NODES), steps=STEPS, step_time=STEP_S, prefix="ranks"
    )
    wait_until(lambda: sum(bool(_ranks(a)) for a in agents) == NODES, 60, "round 1's members", agents=agents)
    (spare,) = [a for a in agents if not _ranks(a)]
    first = {a.name: _ranks(a)[0][1] for a in agents if a is not spare}
    assert sorted(first.values()) == list(range(NODES)), dump(agents)
    return agents, spare, first


def _finish(agents: list[Agent], victim: Agent, tmp_path) -> None:
    survivors = [a for a in agents if a is not victim]
    assert finish_all(survivors) == [0] * NODES, dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), NODES, STEPS, agents)


def test_a_spare_takes_the_rank_of_the_member_that_died_and_the_others_keep_theirs(segment, tmp_path):
    agents, spare, first = _job_with_a_spare(segment, tmp_path)
    victim = next(a for a in agents if first.get(a.name) == 2)  # a member, not the leader (rank 0)
    victim.kill()
    wait_until(lambda: bool(_ranks(spare)), 60, "the spare in a round", agents=agents)
    _finish(agents, victim, tmp_path)
    assert {rank for _, rank in _ranks(spare)} == {first[victim.name]}, dump(agents)
    # Every surviving follower says what broke its round (the leader says whom it lost).
    followers = [a for a in agents if first.get(a.name, 0) > 0 and a is not victim]
    said = f"round 1 broke: node {victim.node_id()} lost"
    assert all(said in a.output() for a in followers), dump(agents)
    for agent in agents:
        if agent is not victim and agent is not spare:
            assert {r for _, r in _ranks(agent)} == {first[agent.name]}, dump(agents)


def test_the_leaders_successor_takes_rank_0_and_the_spare_takes_the_successors_rank(segment, tmp_path):
    agents, spare, first = _job_with_a_spare(segment, tmp_path)
    victim = leader_of(agents)
    assert first[victim.name] == 0
    victim.kill()
    wait_until(lambda: bool(_ranks(spare)), 60, "the spare in a round", agents=agents)
    _finish(agents, victim, tmp_path)
    successor = next(a for a in agents if first.get(a.name) == 1)
    assert leader_of([a for a in agents if a is not victim]) is successor, dump(agents)
    assert _ranks(successor)[-1][1] == 0, dump(agents)
    assert {rank for _, rank in _ranks(spare)} == {1}, dump(agents)
    for agent in agents:
        if first.get(agent.name, 0) >= 2:
            assert {r for _, r in _ranks(agent)} == {first[agent.name]}, dump(agents)
