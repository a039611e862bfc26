"""Fault tolerance with real torchrun agents on 127.0.0.1: worker failure, scale-up, spares, clean end."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.helpers import (
    ROOT,
    agent_env,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    job_processes,
    joins,
    latest_round,
    leader_of,
    logged_at,
    random_port,
    read_reports,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)

pytestmark = pytest.mark.integration


def _cmd(job, nnodes, tmp_path, *, steps, step_time=0.0, extra_args=(), conf=None, restarts=3, nproc=1,
         monitor_s=0.1):  # fmt: skip
    base = {"interface": "127.0.0.1", "port": random_port(), "join_timeout": 120}
    return torchrun_cmd(
        job=job, nnodes=nnodes, nproc=nproc, conf={**base, **(conf or {})},
        extra=[f"--max-restarts={restarts}", f"--monitor-interval={monitor_s}"],
        script_args=[
            "--steps", str(steps), "--step-time", str(step_time),
            "--checkpoint", str(tmp_path / "ckpt"), "--report", str(tmp_path / "report"), *extra_args,
        ],
    )  # fmt: skip


def test_a_failed_worker_restarts_the_round_and_training_resumes(tmp_path):
    job = unique_job("wfail")
    fail = ["--fail-at-step", "5", "--fail-rank", "1", "--fail-once-marker", str(tmp_path / "failed")]
    cmd = _cmd(job, "3", tmp_path, steps=12, step_time=0.1, extra_args=fail)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    assert (tmp_path / "failed").exists(), "the failure was not injected"
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 12)
    assert {r["start_step"] for r in reports} == {5}, "the new round did not resume from the checkpoint"
    assert all(len(joins(a)) >= 2 for a in agents), dump(agents)
    # The workers of the second round know it, and so does the checkpoint they wrote last.
    assert {r["env"]["MINGLE_ROUND"] for r in reports} == {str(latest_round(agents))}
    written = json.loads((tmp_path / "ckpt" / "ckpt.json").read_text())
    assert written == {"job": job, "epoch": 1, "round": 2, "step": 12}


def test_a_member_lost_before_it_wrote_its_role_info_costs_no_300s_wait(tmp_path):
    """Right after next_rendezvous() returns, torch's agents exchange role info in the round's
    store, each read bounded only by the store's 300 s. A member killed in that window never
    writes: the others' reads must end as soon as their node knows the round is over, and the
    next round must form and train (here: the whole job within a minute)."""
    job = unique_job("roleinfo")
    cmd = _cmd(job, "2:3", tmp_path, steps=10, step_time=0.05)
    victim_env = agent_env(TORCH_MINGLE_FAILPOINTS="agent.lost_before_role_info=1")
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(2)]
    # The victim is a member, not the leader (whose death ends the round by another path: the
    # store goes with it): it starts once the two others follow a leader, and their round of
    # three forms when it joins.
    wait_until(
        lambda: any("] leader: this node" in a.output() for a in agents), 60, "a leader", agents=agents
    )
    victim = start_agent("victim", cmd, tmp_path, env=victim_env)
    started = time.monotonic()
    codes = finish_all(agents, timeout=120)
    took = time.monotonic() - started
    assert victim.proc.wait(timeout=30) == -signal.SIGKILL, dump([*agents, victim])
    assert codes == [0, 0], dump([*agents, victim])
    assert took < 60, f"the survivors finished after {took:.0f}s: a read waited out the store's timeout"
    assert any("the round broke before every member took its rank" in a.output() for a in agents), dump(
        agents
    )
    assert_trained_together(final_reports(tmp_path / "report"), 2, 10)


def test_a_new_node_is_admitted_at_the_next_round(tmp_path):
    job = unique_job("scaleup")
    cmd = _cmd(job, "2:3", tmp_path, steps=40, step_time=0.15, conf={"last_call_timeout": 1})
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(2)]
    wait_until(lambda: any("step 3/40" in a.output() for a in agents), 120, "round 1 to train", 0.2, agents)
    agents.append(start_agent("newcomer", cmd, tmp_path))
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 40)
    assert min(r["start_step"] for r in reports) >= 3, "the bigger round did not resume from the checkpoint"
    first_round = [r for r in read_reports(tmp_path / "report") if r["world_size"] == 2]
    assert not first_round or all(r["steps"] == 40 for r in first_round)
    # Restarts for membership changes do not use up --max-restarts.
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reports} == {"0"}, dump(agents)


def test_a_spare_beyond_max_nodes_replaces_a_node_that_dies(tmp_path):
    """Three members and a spare: one member dies (SIGKILL), the two others hold a majority of
    the round's three votes (the dead one keeps its vote: its kernel's close proves nothing a
    partition could not produce), and the spare takes its place."""
    job = unique_job("spare")
    cmd = _cmd(job, "2:3", tmp_path, steps=40, step_time=0.15)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(4)]

    # The first round of three (a start-up race may form a round of two first, which the third
    # node then joins at the next round): its members, and training in it.
    def round_of_three():
        joined = r"joined round (\d+) as rank \d of 3 "
        numbers = {int(n) for a in agents for n in re.findall(joined, a.output())}
        if not numbers:
            return None
        marker = f"joined round {min(numbers)} as rank"
        members = [a for a in agents if marker in a.output()]
        trained = any("/40 loss" in a.output().split(marker, 1)[1] for a in members)
        return (marker, members) if len(members) == 3 and trained else None

    wait_until(round_of_three, 120, "a round of three to train", 0.2, agents)
    marker, members = round_of_three()
    (spare,) = [a for a in agents if a not in members]
    (victim,) = [a for a in members if f"{marker} 2" in a.output()]
    assert "still waiting for a place" in spare.output() or "joined round" not in spare.output()
    victim.kill()  # the agent and its workers, as if the node died
    survivors = [a for a in agents if a is not victim]
    codes = finish_all(survivors)
    assert codes == [0, 0, 0], dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 40)
    # (the round after the death: its number is not fixed, a start-up race may have used one)
    assert "as rank 2 of 3" in spare.output() and f"{marker} " not in spare.output(), dump(agents)


def test_a_killed_agent_restarted_on_its_host_gets_its_vote_back_at_once(tmp_path):
    """A job of two nodes (--nnodes=1:2): one agent is killed. The survivor alone is enough
    nodes, but holds 1 of the round's 2 votes: it waits (the other may be alive across a
    partition). torchrun started again on that host takes over the dead agent's node id and
    vote (``_identity``): the round forms at once."""
    job = unique_job("revive")
    state = tmp_path / "state"
    conf = {"state_dir": str(state), "last_call_timeout": 1}
    cmd = _cmd(job, "1:2", tmp_path, steps=40, step_time=0.15, conf=conf)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(2)]
    wait_until(lambda: any("step 3/40" in a.output() for a in agents), 120, "round 1 to train", 0.2, agents)
    leader = leader_of(agents)
    victim = next(a for a in agents if a is not leader)
    victim_id = victim.node_id()
    victim.kill()
    waits = "the next round waits: no quorum: 1 of the 2 voting members of round 1 joined"
    wait_until(lambda: waits in leader.output(), 30, "the survivor to wait for a quorum", 0.2, agents)
    back = start_agent("node1-again", cmd, tmp_path)
    codes = finish_all([leader, back])
    assert codes == [0, 0], dump([*agents, back])
    assert back.node_id() == victim_id, dump([back])
    assert "takes over node" in back.output(), dump([back])
    assert_trained_together(final_reports(tmp_path / "report"), 2, 40)


def test_a_relaunch_on_fewer_hosts_says_at_once_that_kept_votes_hold_it_and_what_to_do(tmp_path):
    """A job of three ran round 1 and all its agents were killed; the same command is run again
    on one host within join_timeout: its vote, kept in state_dir, needs a majority of round 1's.
    It says so within discovery_warning, with how to go on, not after join_timeout."""
    job = unique_job("relaunch")
    conf = {"state_dir": str(tmp_path / "state"), "last_call_timeout": 1, "discovery_warning": 2}
    cmd = _cmd(job, "1:3", tmp_path, steps=400, step_time=0.1, conf=conf)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    wait_until(lambda: all("joined round " in a.output() for a in agents), 120, "round 1", 0.2, agents)
    for agent in agents:
        agent.kill()
    again = start_agent("node0-again", cmd, tmp_path)
    try:
        said = "relaunch under a new --rdzv_id, or with --rdzv_conf state_dir=none"
        wait_until(lambda: said in again.output(), 30, "the advice", 0.2, [again])
        assert "no quorum: 1 of the 3 voting members of round 1 joined" in again.output(), dump([again])
        assert "joined round" not in again.output(), dump([again])
    finally:
        again.kill()


def test_a_spare_that_is_never_needed_exits_cleanly(tmp_path):
    job = unique_job("idle-spare")
    cmd = _cmd(job, "2", tmp_path, steps=10, step_time=0.1)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    (spare,) = [a for a in agents if "joined round" not in a.output()]
    assert "finished before this node was admitted" in spare.output()
    assert_trained_together(final_reports(tmp_path / "report"), 2, 10)


def test_clean_end_when_the_leader_finishes_first(tmp_path):
    job = unique_job("end")
    # Rank 0 (the leader's worker) exits at once; the others linger: the leader's agent reaches
    # its exit barrier and shutdown first, and its store must outlive everyone else's barrier.
    cmd = _cmd(job, "3", tmp_path, steps=4, extra_args=["--linger", "3"], restarts=0)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 3, 4)
    for agent in agents:
        assert "Error waiting on exit barrier" not in agent.output(), dump(agents)
    assert job_processes(job) == [], "agents or workers of the job are still running"


@pytest.mark.parametrize("fail_rank", [0, 2], ids=["leader", "follower"])
def test_a_node_whose_workers_fail_on_the_way_out_does_not_hold_the_others(tmp_path, fail_rank):
    job = unique_job("exitfail")
    # Training completes; then one rank exits 1. With no restarts left its agent fails and leaves
    # instead of reaching torch's exit barrier, where the others would wait 300 s for it.
    fail = ["--fail-at-step", "4", "--fail-rank", str(fail_rank)]
    cmd = _cmd(job, "3", tmp_path, steps=4, extra_args=fail, restarts=0)
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    codes = finish_all(agents, timeout=120)  # well under the barrier's 300 s
    failing = [a for a in agents if f"rank {fail_rank}: injected failure at step 4" in a.output()]
    assert len(failing) == 1, dump(agents)  # (none: that rank never ran its last step)
    failed = failing[0]
    assert sorted(codes) == [0, 0, 1] and codes[agents.index(failed)] == 1, dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 3, 4)
    assert "exit barrier of round 1 opened: 2 node(s) arrived, 1 left or died" in leader_of(agents).output()
    for agent in agents:
        if agent is not failed:
            assert "Done waiting for other agents" in agent.output(), dump(agents)
            assert "Error waiting on exit barrier" not in agent.output(), dump(agents)
    assert job_processes(job) == [], "agents or workers of the job are still running"


@pytest.mark.parametrize("who", ["leader", "follower"])
def test_a_preempted_node_leaves_at_once_and_the_others_keep_their_restarts(tmp_path, who):
    """SIGTERM to one agent of four (a preemption notice): its node leaves with a message, the
    others form a new round without waiting for a heartbeat timeout, and their workers stop
    for the membership change, not for a failure: ``--max-restarts=0`` would end them.

    The agents poll out of phase, a fifth of a monitor interval apart (as a long run drifts
    them), and the workers are always in a collective: an agent that stopped its workers as
    soon as it polled would fail the others' before their agents polled (every run, before
    the polls were held for a common time: ``_hold_for_the_others``)."""
    job = unique_job("preempt")
    conf = {"last_call_timeout": 1, "keep_alive_interval": 5, "keep_alive_max_attempt": 3}
    cmd = _cmd(job, "2:4", tmp_path, steps=300, step_time=0.03, conf=conf, restarts=0, monitor_s=0.5)
    launcher = [cmd[0], str(ROOT / "tests" / "phase_launcher.py"), *cmd[3:]]  # not -m torch.distributed.run
    agents = [
        start_agent(f"node{i}", launcher, tmp_path, env=agent_env(POLL_SHIFT_S=str(0.1 * i)), job=job)
        for i in range(4)
    ]
    wait_until(lambda: any("step 20/300" in a.output() for a in agents), 120, "round 1 to train", 0.2, agents)
    leader = leader_of(agents)
    victim = leader if who == "leader" else next(a for a in agents if a is not leader)
    signalled = time.time()
    victim.proc.send_signal(signal.SIGTERM)  # the agent only: torchrun stops its own workers
    survivors = [a for a in agents if a is not victim]
    codes = finish_all(survivors)
    assert codes == [0, 0, 0], dump(agents)
    victim.wait(60, company=agents)
    assert "SIGTERM: leaving the job" in victim.output(), dump([victim])
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 300)
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reports} == {"0"}, dump(agents)
    joined = [logged_at(a, "joined round ", after=signalled) for a in survivors]
    assert all(j is not None for j in joined), dump(agents)
    took = max(j for j in joined if j is not None) - signalled
    print(f"preempted {who}: the other three joined a new round {took:.2f}s after SIGTERM")
    # Not a heartbeat timeout (15 s): the leave was said, not inferred from silence (a poll
    # interval and a poll held for the others: 1.3 s).
    assert took < conf["keep_alive_interval"] * conf["keep_alive_max_attempt"] / 2, dump(agents)


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_site_event_handler_sees_join_death_and_close(tmp_path):
    """torch's rendezvous events (``_events``), as a site's handler receives them: every node
    records its join, the round and its rank; the leader records the member it lost, and the
    survivors join again and close."""
    job = unique_job("events")
    cmd = _cmd(job, "2:3", tmp_path, steps=30, step_time=0.1)
    launcher = [
        cmd[0],
        str(ROOT / "tests" / "events_launcher.py"),
        *cmd[3:],
    ]  # instead of -m torch.distributed.run
    files = {f"node{i}": tmp_path / f"events-{i}.jsonl" for i in range(3)}
    agents = [start_agent(name, launcher, tmp_path, env=agent_env(EVENTS_FILE=str(path)), job=job)
              for name, path in files.items()]  # fmt: skip
    wait_until(lambda: any("step 3/30" in a.output() for a in agents), 120, "round 1 to train", 0.2, agents)
    leader = leader_of(agents)
    victim = next(a for a in agents if a is not leader)
    victim.kill()
    survivors = [a for a in agents if a is not victim]
    assert finish_all(survivors) == [0, 0], dump(agents)
    for agent in agents:
        events = _events(files[agent.name])
        names = [e["name"] for e in events]
        assert {e["run_id"] for e in events} == {job}
        # The node may find its leader before torch's agent first asks to join: that comes first.
        assert set(names[: names.index("mingle:join")]) <= {"mingle:leader_found", "mingle:leader_elected"}
        assert names.index("mingle:joined") > names.index("mingle:join")
        joined = next(e for e in events if e["name"] == "mingle:joined")
        assert joined["rank"] in (0, 1, 2) and joined["master_endpoint"].startswith("127.0.0.1:")
        assert joined["node_state"] == "RUNNING"
        if agent is victim:
            continue
        assert names.count("mingle:joined") == 2, names  # round 1, then round 2 without the victim
        assert names[-1] == "mingle:shutdown", names
        assert events[-1]["node_state"] == "SUCCEEDED"
    lead = [e["name"] for e in _events(files[leader.name])]
    assert "mingle:leader_elected" in lead and "mingle:round_complete" in lead
    lost = lead.index("mingle:node_lost")
    assert lead.index("mingle:round_complete", lost) > lost  # the next round formed after the loss
    assert "mingle:closed" in lead
    follower = next(a for a in survivors if a is not leader)
    follow = [e["name"] for e in _events(files[follower.name])]
    assert "mingle:leader_found" in follow and "mingle:keep_alive" in follow
