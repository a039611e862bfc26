"""The leader frozen, cut off, or deposed by a flapping node: one torchrun agent per namespace.

Heartbeats are 1 s x 3 here, so a leader that stops answering is lost after 3 s; the
survivors must train again within that + 3 s, and the old leader, when it comes back, must
be fenced without disturbing the job.
"""

from __future__ import annotations

import signal
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
    logged_at,
    resume_phases,
    start_training,
    wait_until,
)

pytestmark = pytest.mark.netns

KEEP_ALIVE = {"keep_alive_interval": 1, "keep_alive_max_attempt": 3}
DETECT_S = 3.0  # keep_alive_interval x keep_alive_max_attempt


def _start(segment, tmp_path, *, n, nnodes, steps, step_time, conf):
    hosts = [segment.add_host(f"198.18.0.{10 + i}") for i in range(1, n + 1)]
    conf = {**KEEP_ALIVE, **conf}
    agents = start_training(
        hosts, tmp_path, conf, nnodes=nnodes, steps=steps, step_time=step_time, prefix="lf"
    )
    return hosts, agents


def _with_a_waiting_spare(segment, tmp_path):
    """Four nodes of a three-node job: three train, the fourth waits as a spare, blocked in its join."""
    hosts, agents = _start(segment, tmp_path, n=4, nnodes="3", steps=150, step_time=0.1, conf={})
    wait_until(
        lambda: any("waiting while the job runs without this node" in a.output() for a in agents),
        30,
        "the spare to wait",
        agents=agents,
    )
    return hosts, agents


def _rounds_formed(agent) -> int:
    return int(agent.output().count(" formed ("))


@pytest.mark.parametrize("fault", ["sigstop", "link_down"])
def test_a_lost_leader_is_replaced_while_a_spare_waits_and_is_fenced_when_it_returns(
    segment, tmp_path, fault
):
    hosts, agents = _with_a_waiting_spare(segment, tmp_path)
    old = leader_of(agents)
    old_host = hosts[agents.index(old)]
    survivors = [a for a in agents if a is not old]
    before = latest_round(agents)
    lost_at = time.time()
    if fault == "sigstop":
        old.kill(signal.SIGSTOP)  # the whole process tree: agent and workers; no socket closes
    else:
        segment.link(old_host, up=False)  # its host vanishes from the network
    try:
        wait_until(
            lambda: all(joined_after(a, before) for a in survivors),
            60,
            "the survivors and the spare to form a round without it",
            agents=agents,
        )
        new = leader_of(survivors)
        resumed = f"joined round {latest_round([new])} as rank"
        wait_until(lambda: "step 10/" in new.output().split(resumed)[-1], 60, "the new round to train", 0.1)
        formed_before = _rounds_formed(new)
    finally:
        if fault == "sigstop":
            old.kill(signal.SIGCONT)
        else:
            segment.link(old_host, up=True)
    # It comes back believing it leads epoch 1: it must step down, and the job must not notice.
    wait_until(lambda: "stepping down" in old.output(), 30, "the old leader to step down", agents=agents)
    codes = finish_all(agents)
    assert codes == [0, 0, 0, 0], dump(agents)
    assert _rounds_formed(new) == formed_before, "the returning leader restarted the job\n" + dump(agents)
    assert "(epoch 2)" in new.output(), dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 150, agents)
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {hosts[agents.index(new)].ip}, dump(agents)
    assert "finished before this node was admitted" in old.output(), dump(agents)
    # The new round, on every survivor and the spare: the heartbeat timeout, then milliseconds.
    joined = [logged_at(a, "joined round ", after=lost_at) for a in survivors]
    assert None not in joined, dump(agents)
    rendezvous = max(j for j in joined if j is not None) - lost_at
    # Training again: the new round's workers start (Python and torch), join their process
    # group, and build DistributedDataParallel, whose first use imports torch._dynamo (about
    # 1.8 s per fresh worker on 2 cores): that is the training script's cost, not mingle's.
    phases = resume_phases(tmp_path / "report", lost_at)
    assert phases is not None, "no round started after the leader was lost"
    print(
        f"{fault} of the leader: new round after {rendezvous:.2f}s; workers started "
        f"{phases['started']:.2f}s, all in their process group {phases['group']:.2f}s, DDP built "
        f"{phases['ddp']:.2f}s, first step {phases['trained']:.2f}s"
    )
    assert rendezvous <= DETECT_S + 3.0, dump(agents)
    assert phases["trained"] <= DETECT_S + 8.0, dump(agents)  # a sanity bound; timings: docs/faults.md


def test_a_flapping_follower_never_deposes_the_healthy_leader(segment, tmp_path):
    # 2:3 nodes: the two that stay connected go on; the cut one elects itself alone.
    hosts, agents = _start(
        segment, tmp_path, n=3, nnodes="2:3", steps=200, step_time=0.1, conf={"rejoin_delay": 3}
    )
    leader = leader_of(agents)
    flapper = next(a for a in agents if a is not leader)
    flapper_host = hosts[agents.index(flapper)]
    before = len(flapper.output())
    job_round = latest_round(agents)
    segment.link(flapper_host, up=False)
    try:
        wait_until(
            lambda: "this node leads job" in flapper.output()[before:], 30, "the cut node to elect itself"
        )
        wait_until(lambda: joined_after(leader, job_round), 30, "the others to go on", agents=agents)
    finally:
        segment.link(flapper_host, up=True)
    wait_until(
        lambda: "stepping down" in flapper.output()[before:], 30, "the flapper to yield", agents=agents
    )
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    assert "stepping down" not in leader.output(), "a bare claim deposed the healthy leader\n" + dump(agents)
    assert leader.output().count("this node leads job") == 1, dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 200, agents)  # re-admitted once the fresh round had run 3 s
