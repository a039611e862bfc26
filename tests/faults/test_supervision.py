"""No background loop dies silently: an error makes the node recover, or fail loudly and at once.

Failpoints (``torch_mingle/_faults.py``) raise inside each loop on purpose.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.helpers import (
    agent_env,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    random_port,
    rendezvous_all,
    rendezvous_as_agents,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)
from torch_mingle import _faults
from torch_mingle.errors import MingleStateError

pytestmark = pytest.mark.integration


def _recovered(handlers) -> list[object]:
    return [h for h in handlers if h.diagnostics().recoveries]


@pytest.mark.parametrize(("point", "times"), [("leader.decide", 1), ("worker.open_store", 3)])
def test_an_error_in_the_leaders_work_makes_it_resign_and_another_node_leads(
    make_handler, caplog, point, times
):
    job = unique_job("resign")
    _faults.arm(point, times=times)  # the first leader fails: in its decisions, or it cannot open stores
    handlers = [make_handler(job, 3) for _ in range(3)]
    with caplog.at_level(logging.ERROR, logger="torch_mingle"):
        infos = rendezvous_all(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    assert _faults.remaining(point) == 0, "the failpoint was never reached"
    (failed,) = [h for h in handlers if h.diagnostics().recoveries]
    assert "failpoint" in (failed.diagnostics().last_error or "") or "Too many open files" in (
        failed.diagnostics().last_error or ""
    )
    assert not failed.diagnostics().is_leader  # it resigned; another node leads
    assert any("resigning as leader after an internal error" in r.getMessage() for r in caplog.records)


def test_a_store_that_fails_to_open_once_is_opened_again_without_resigning(make_handler, caplog):
    job = unique_job("retry")
    handlers = [make_handler(job, 2) for _ in range(2)]
    assert handlers[0].wait_diagnostics(lambda d: d.leader is not None, 10) is not None
    _faults.arm("worker.open_store", times=1)  # e.g. out of descriptors for a moment
    with caplog.at_level(logging.WARNING, logger="torch_mingle"):
        infos = rendezvous_all(handlers)
        # The next round's store is opened a moment after the round formed; whichever open
        # failed, the one tried again is named to the follower, which connects to it ahead.
        follower = next(h for h in handlers if not h.diagnostics().is_leader)
        assert follower.wait_diagnostics(lambda d: d.store_ahead, 10.0) is not None, follower.diagnostics()
    assert sorted(i.rank for i in infos) == [0, 1]
    assert _faults.remaining("worker.open_store") == 0, "the failpoint was never reached"
    assert not any(h.diagnostics().recoveries for h in handlers), "a passing failure made the leader resign"
    assert any("cannot open a round store" in r.getMessage() for r in caplog.records)


def _three_with_a_leader(make_handler, prefix: str):
    """Three handlers of one job, once they know their leader (the failpoint then hits a follower)."""
    job = unique_job(prefix)
    handlers = [make_handler(job, 3) for _ in range(3)]
    leader = handlers[0].wait_diagnostics(lambda d: d.leader is not None, 10)
    assert leader is not None
    return handlers, leader


def test_a_store_connect_that_times_out_while_the_leader_answers_is_tried_again(make_handler, caplog):
    """A slow resolver or a burst of joins is load, not a lost leader: no new election."""
    # Armed before the nodes start: they connect ahead as soon as the leader names its store.
    _faults.arm("store.connect_ahead", times=1000)  # every agent connects when the round forms
    handlers, leader = _three_with_a_leader(make_handler, "connect")
    _faults.arm("store.connect", times=2)
    with caplog.at_level(logging.WARNING, logger="torch_mingle"):
        infos = rendezvous_all(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    assert _faults.remaining("store.connect") == 0, "the failpoint was never reached"
    after = [h.diagnostics() for h in handlers]
    assert {(d.leader, d.epoch, d.round) for d in after} == {(leader.leader, leader.epoch, 1)}
    assert sum("the leader still answers, trying again" in r.getMessage() for r in caplog.records) == 2
    assert not any("lost leader" in r.getMessage() for r in caplog.records)


def test_a_client_that_cannot_connect_ahead_costs_nothing_but_the_connect(make_handler, caplog):
    """The connector thread's failure is the job's result: the agent connects itself, no re-election."""
    # Armed before the nodes start: they connect ahead as soon as the leader names its store.
    _faults.arm("store.connect_ahead", times=1000)
    handlers, leader = _three_with_a_leader(make_handler, "ahead")
    with caplog.at_level(logging.DEBUG, logger="torch_mingle"):
        infos = rendezvous_all(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    assert _faults.remaining("store.connect_ahead") < 1000, "no client was opened ahead"
    assert {(h.diagnostics().leader, h.diagnostics().round) for h in handlers} == {(leader.leader, 1)}
    assert not any("was connected ahead" in r.getMessage() for r in caplog.records)
    assert all(h.diagnostics().loop_alive and h.diagnostics().recoveries == 0 for h in handlers)
    infos[2].store.set("k", "v")
    assert [i.store.get("k") for i in infos] == [b"v"] * 3


def test_an_error_in_a_followers_session_makes_it_join_again(make_handler, caplog):
    """If the error meets the frame that brings the round, the round breaks as it forms: the
    others re-join as torch's agents would (``rendezvous_as_agents``)."""
    handlers, _ = _three_with_a_leader(make_handler, "rejoin")
    _faults.arm("follower.frame", times=1)
    with caplog.at_level(logging.ERROR, logger="torch_mingle"):
        infos = rendezvous_as_agents(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    assert _faults.remaining("follower.frame") == 0
    assert len(_recovered(handlers)) == 1
    assert len({h.diagnostics().leader for h in handlers}) == 1, "the error deposed the leader"
    assert any("joining the leader again after an internal error" in r.getMessage() for r in caplog.records)


def test_errors_that_keep_coming_fail_the_node_loudly_and_at_once(make_handler):
    handler = make_handler(unique_job("fatal"), 2, join_timeout="300")
    _faults.arm("loop.callback", times=1000)
    started = time.monotonic()
    with pytest.raises(MingleStateError, match="rendezvous loop stopped"):
        handler.next_rendezvous()
    assert time.monotonic() - started < 10, "it waited for join_timeout instead of failing at once"
    assert not handler.diagnostics().loop_alive


def test_an_error_in_the_loop_itself_fails_the_node_loudly(make_handler):
    handler = make_handler(unique_job("loopdeath"), 2, join_timeout="300")
    handler.wait_diagnostics(lambda d: d.leader is not None, 10)
    _faults.arm("loop.iterate", times=1)
    assert handler.wait_diagnostics(lambda d: not d.loop_alive, 10) is not None
    with pytest.raises(MingleStateError, match="rendezvous loop stopped"):
        handler.next_rendezvous()


def test_a_leader_whose_loop_dies_mid_training_fails_loudly_and_the_others_go_on(tmp_path):
    conf = {"interface": "127.0.0.1", "port": random_port(), "join_timeout": 60, "last_call_timeout": 1,
            "keep_alive_interval": 1, "keep_alive_max_attempt": 3}  # fmt: skip
    cmd = torchrun_cmd(
        job=unique_job("loopfail"), nnodes="2:3", nproc=1, conf=conf, extra=["--max-restarts=3"],
        script_args=["--steps", "150", "--step-time", "0.1", "--checkpoint", str(tmp_path / "ckpt"),
                     "--report", str(tmp_path / "report")],
    )  # fmt: skip
    doomed = start_agent("doomed", cmd, tmp_path, env=agent_env(TORCH_MINGLE_FAILPOINTS="loop.iterate=1:9"))
    wait_until(
        lambda: "this node leads job" in doomed.output(), 60, "the first node to lead", agents=[doomed]
    )
    others = [start_agent(f"node{i}", cmd, tmp_path) for i in range(2)]
    agents = [doomed, *others]
    try:
        wait_until(lambda: "rendezvous loop stopped" in doomed.output(), 60, "the loop to die", 0.1, agents)
        codes = finish_all(others)
        assert doomed.wait(30, company=agents) != 0, dump(agents)
    finally:
        for a in agents:
            a.kill()
    assert codes == [0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 2, 150, agents)
    assert "MingleStateError" in doomed.output(), dump(agents)
