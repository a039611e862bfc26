"""Node loss, leader loss and partitions, one torchrun agent per network namespace.

Frozen and cut-off leaders are in ``tests/faults/``.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers import (
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    joined_after,
    latest_round,
    leader_of,
    resume_delay,
    start_training,
    wait_until,
)

pytestmark = pytest.mark.netns


def _start(segment, tmp_path, *, steps, step_time, conf=None, n=3):
    hosts = [segment.add_host(f"198.18.0.{10 + i}") for i in range(1, n + 1)]
    agents = start_training(
        hosts, tmp_path, conf or {}, nnodes=f"2:{n}", steps=steps, step_time=step_time, prefix="ft"
    )
    return hosts, agents


def test_a_dead_node_is_dropped_and_the_others_finish(segment, tmp_path):
    hosts, agents = _start(segment, tmp_path, steps=50, step_time=0.15)
    leader = leader_of(agents)
    victim = next(a for a in agents if a is not leader)
    killed_at = time.time()
    victim.kill()  # SIGKILL to the agent and its workers
    survivors = [a for a in agents if a is not victim]
    assert finish_all(survivors) == [0, 0], dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 2, 50, agents)
    assert min(r["start_step"] for r in reports) >= 5, "did not resume from the checkpoint"
    leader_ip = hosts[agents.index(leader)].ip
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {leader_ip}
    delay = resume_delay(tmp_path / "report", killed_at)
    assert delay is not None, "no round started after the kill"
    print(f"node loss: training resumed {delay:.2f}s after the kill")


def test_the_leader_dies_and_a_new_leader_takes_over(segment, tmp_path):
    hosts, agents = _start(segment, tmp_path, steps=50, step_time=0.15)
    old = leader_of(agents)
    old_ip = hosts[agents.index(old)].ip
    old_port = {r["env"]["MASTER_PORT"] for r in final_reports(tmp_path / "report")} or None
    killed_at = time.time()
    old.kill()
    survivors = [a for a in agents if a is not old]
    assert finish_all(survivors) == [0, 0], dump(agents)
    new = leader_of(survivors)
    assert "(epoch 2)" in new.output(), dump(agents)
    new_ip = hosts[agents.index(new)].ip
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 2, 50, agents)
    assert min(r["start_step"] for r in reports) >= 5, "did not resume from the checkpoint"
    # Fresh bootstrap info: every worker of the new round got the new rank 0's IP and store.
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {new_ip}
    assert new_ip != old_ip
    assert old_port is None or {r["env"]["MASTER_PORT"] for r in reports}.isdisjoint(old_port)
    delay = resume_delay(tmp_path / "report", killed_at)
    assert delay is not None, "no round started after the kill"
    print(f"leader loss: training resumed {delay:.2f}s after the kill")


def test_a_partitioned_node_waits_and_rejoins_when_the_link_heals(segment, tmp_path):
    # rejoin_delay: once healed, the node may restart the majority's round after 2 s of training.
    conf = {"keep_alive_interval": 1, "keep_alive_max_attempt": 2, "rejoin_delay": 2}
    hosts, agents = _start(segment, tmp_path, steps=160, step_time=0.1, conf=conf)
    leader = leader_of(agents)
    cut = next(a for a in agents if a is not leader)
    cut_host = hosts[agents.index(cut)]
    before = len(cut.output())
    job_round = latest_round(agents)
    segment.link(cut_host, up=False)
    majority = [a for a in agents if a is not cut]
    # The majority (2 >= min_nodes) goes on without the cut node...
    wait_until(lambda: all(joined_after(a, job_round) for a in majority), 60, "the majority's new round")
    # ...and the cut node, alone below min_nodes, elects itself but never forms a job.
    wait_until(lambda: "this node leads job" in cut.output()[before:], 60, "the cut node to lead its side")
    assert "joined round" not in cut.output()[before:], dump(agents)
    segment.link(cut_host, up=True)
    assert finish_all(agents) == [0, 0, 0], dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 160, agents)  # one job under one leader
    assert all(r["world_size"] != 1 for r in final_reports(tmp_path / "report"))
