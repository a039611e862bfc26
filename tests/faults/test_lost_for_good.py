"""A job that can never form its next round fails after join_timeout, naming whom it waited for."""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers import (
    Agent,
    dump,
    leader_of,
    random_port,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)

JOIN_TIMEOUT_S = 10.0


def exit_times(agents: list[Agent], timeout: float) -> dict[str, tuple[int, float]]:
    """Each agent's exit code and when it exited; kills what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    done: dict[str, tuple[int, float]] = {}
    try:
        while len(done) < len(agents) and time.monotonic() < deadline:
            for a in agents:
                if a.name not in done and a.proc.poll() is not None:
                    done[a.name] = (a.proc.returncode, time.monotonic())
            time.sleep(0.05)
    finally:
        for a in agents:
            a.kill()
    assert len(done) == len(agents), f"agents still running after {timeout:g}s\n{dump(agents)}"
    return done


def _node_id(agent: Agent) -> str:
    label = re.search(r"\[\S+ ([0-9a-f]{16})\] mingle rendezvous", agent.output())
    assert label is not None, agent.output()
    return label.group(1)


@pytest.mark.integration
def test_a_fixed_size_job_that_loses_a_node_fails_within_join_timeout_naming_it(tmp_path):
    conf = {"interface": "127.0.0.1", "port": random_port(), "join_timeout": JOIN_TIMEOUT_S,
            "keep_alive_interval": 1, "keep_alive_max_attempt": 3}  # fmt: skip
    cmd = torchrun_cmd(
        job=unique_job("fixed"), nnodes="3", nproc=1, conf=conf, extra=["--max-restarts=3"],
        script_args=["--steps", "400", "--step-time", "0.1", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    try:
        wait_until(lambda: any("step 5/" in a.output() for a in agents), 120, "the job to train", 0.1, agents)
        leader = leader_of(agents)
        victim = next(a for a in agents if a is not leader)
        victim_id = _node_id(victim)
        lost_at = time.monotonic()
        victim.kill()
        survivors = [a for a in agents if a is not victim]
        exits = exit_times(survivors, JOIN_TIMEOUT_S + 30)
    finally:
        for a in agents:
            a.kill()
    for a in survivors:
        code, when = exits[a.name]
        assert code != 0, dump(agents)
        assert when - lost_at <= JOIN_TIMEOUT_S + 5, (
            f"{a.name} failed after {when - lost_at:.1f}s\n{dump(agents)}"
        )
        out = a.output()
        # The first to time out closes the job (torch's shutdown contract); the other learns
        # it from the close, which carries the same reason.
        assert (
            "MingleTimeoutError" in out
            or "closed the job (it shut down after: its rendezvous timed out" in out
        )
        assert f"waiting for {victim_id} (127.0.0.1: " in out, dump(agents)
        # How many had joined depends on which survivor's agent re-joined first after its
        # workers failed (1 or 2 of 3; a follower may still wait for the leader's own join).
        assert re.search(r"[12] of min_nodes=3 nodes joined|waiting for the leader's own join", out), dump(
            agents
        )
    print(
        "fixed-size loss: survivors failed after", [round(exits[a.name][1] - lost_at, 1) for a in survivors]
    )


@pytest.mark.netns
def test_an_isolated_leader_below_min_nodes_fails_within_join_timeout(segment, tmp_path):
    hosts = [segment.add_host(f"198.18.0.{10 + i}") for i in range(1, 4)]
    conf = {"interface": "eth0", "join_timeout": JOIN_TIMEOUT_S, "last_call_timeout": 1,
            "keep_alive_interval": 1, "keep_alive_max_attempt": 3}  # fmt: skip
    cmd = torchrun_cmd(
        job=unique_job("iso"), nnodes="2:3", nproc=1, conf=conf, extra=["--max-restarts=3"],
        script_args=["--steps", "120", "--step-time", "0.1", "--checkpoint", str(tmp_path / "ckpt"),
                     "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    try:
        wait_until(lambda: any("step 5/" in a.output() for a in agents), 120, "the job to train", 0.1, agents)
        leader = leader_of(agents)
        cut_at = time.monotonic()
        segment.link(hosts[agents.index(leader)], up=False)
        exits = exit_times(agents, 120)
    finally:
        for a in agents:
            a.kill()
    others = [a for a in agents if a is not leader]
    assert [exits[a.name][0] for a in others] == [0, 0], dump(agents)  # the majority finished the job
    code, when = exits[leader.name]
    assert code != 0, dump(agents)
    # Lost by silence after 3 s, then join_timeout alone.
    assert when - cut_at <= 3 + JOIN_TIMEOUT_S + 5, (
        f"failed {when - cut_at:.1f}s after the cut\n{dump(agents)}"
    )
    out = leader.output()
    assert "1 of min_nodes=2 nodes joined" in out and "no heartbeat" in out, dump(agents)
