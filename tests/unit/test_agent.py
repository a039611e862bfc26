"""The agent's side of ``next_rendezvous()`` (``_agent``): each outcome, the action it leads to.

The handler carries these actions out on torch's thread (tests/integration) and the swarm's
agents in simulated time; here the decisions alone, as transcripts of events and actions.
"""

from __future__ import annotations

import pytest

from torch_mingle._agent import (
    DATA_PATH_GRACE_S,
    STORE_CONNECT_ATTEMPTS,
    Answered,
    AskJoin,
    Began,
    BreakSeen,
    CheckHealth,
    ConnectStore,
    Deliver,
    ExitClean,
    Fail,
    Failure,
    HealthChecked,
    JoinFlow,
    Probed,
    ProbePeers,
    StoreFailed,
    StoreOpened,
    TellStoreUnreachable,
    Told,
    WatchBreak,
    nodes_waiting,
)
from torch_mingle._claims import Claim
from torch_mingle._records import JobEnd, Round, Status
from torch_mingle._view import Diagnostics, JobOver, Joined, TimedOut

ME, LEADER = 0x2, 0x1
ROUND = Round(number=3, epoch=1, members=(LEADER, 0x3, ME), store_ip="198.18.0.1", store_port=5001)
JOINED = Joined(ROUND, Claim(1, LEADER), "198.18.0.1")
STORE_S = 5.0


def kind(action: object) -> Failure | None:
    return action.kind if isinstance(action, Fail) else None


def flow(**kw: object) -> JoinFlow:
    args: dict[str, object] = {"join_timeout_s": 60.0, "store_timeout_s": STORE_S} | kw
    return JoinFlow(ME, "job", **args)  # type: ignore[arg-type]


def test_a_round_answered_is_delivered_after_its_store_and_data_path():
    f = flow()
    assert f.step(Began(), 100.0) == AskJoin(60.0)
    assert f.step(Answered(JOINED), 101.0) == ConnectStore(1, STORE_S)
    assert f.step(StoreOpened(), 101.1) == ProbePeers(2, (0, 1))
    assert f.step(Probed(ok=True), 101.2) == Deliver(JOINED, 2, 3)


def test_a_store_client_connected_ahead_is_not_connected_again():
    f = flow()
    f.step(Began(), 0.0)
    assert f.step(Answered(Joined(ROUND, Claim(1, LEADER), None, client=object())), 1.0) == ProbePeers(
        2, (0, 1)
    )


def test_a_store_that_fails_while_the_leader_answers_is_tried_again_longer_then_reported():
    f = flow()
    f.step(Began(), 0.0)
    f.step(Answered(JOINED), 1.0)
    for attempt in range(2, STORE_CONNECT_ATTEMPTS + 1):
        assert f.step(StoreFailed("refused", broke=False), 2.0) == ConnectStore(attempt, STORE_S * attempt)
    told = f.step(StoreFailed("refused", broke=False), 20.0)
    assert told == TellStoreUnreachable(Claim(1, LEADER), "refused")
    assert f.step(Told(), 20.0) == AskJoin(40.0)  # what is left of join_timeout
    assert f.step(Answered(JOINED), 21.0) == ConnectStore(1, STORE_S)  # a new round: from the first try


def test_a_store_that_fails_once_the_round_broke_is_reported_at_once():
    f = flow()
    f.step(Began(), 0.0)
    f.step(Answered(JOINED), 1.0)
    assert f.step(StoreFailed("reset", broke=True), 1.5) == TellStoreUnreachable(Claim(1, LEADER), "reset")


def test_a_failed_probe_joins_again_if_the_round_broke_meanwhile_and_fails_the_job_if_not():
    f = flow()
    f.step(Began(), 0.0)
    f.step(Answered(JOINED), 1.0)
    f.step(StoreOpened(), 1.0)
    assert f.step(Probed(ok=False), 6.0) == WatchBreak(ROUND.key, DATA_PATH_GRACE_S)
    assert f.step(BreakSeen(broke=True), 6.5) == AskJoin(53.5)
    f.step(Answered(JOINED), 7.0)
    f.step(StoreOpened(), 7.0)
    f.step(Probed(ok=False), 12.0)
    assert f.step(BreakSeen(broke=False), 13.0) == Fail(Failure.DATA_PATH, "", close=True)


def test_a_round_that_broke_because_the_job_failed_fails_the_data_path_too():
    f = flow()
    f.step(Began(), 0.0)
    f.step(Answered(JOINED), 1.0)
    f.step(StoreOpened(), 1.0)
    f.step(Probed(ok=False), 2.0)
    assert kind(f.step(BreakSeen(broke=True, failure="a peer's data path"), 2.0)) is Failure.DATA_PATH


def test_a_failed_probe_blames_no_path_when_the_job_closed_meanwhile():
    f = flow()
    f.step(Began(), 0.0)
    f.step(Answered(JOINED), 1.0)
    f.step(StoreOpened(), 1.0)
    f.step(Probed(ok=False), 6.0)
    assert kind(f.step(BreakSeen(broke=False, closed=True), 7.0)) is Failure.CLOSED


def test_a_job_that_failed_while_the_probe_ran_fails_the_join():
    f = flow()
    f.step(Began(), 0.0)
    f.step(Answered(JOINED), 1.0)
    f.step(StoreOpened(), 1.0)
    assert f.step(Probed(ok=True, failure="rank 1 cannot reach rank 2"), 2.0) == Fail(
        Failure.CLOSED, "the job failed: rank 1 cannot reach rank 2"
    )


@pytest.mark.parametrize(
    ("began", "expected"),
    [(Began(shut=True), Failure.SHUT), (Began(closed=True, failure="x"), Failure.CLOSED)],
)
def test_a_shut_handler_or_a_closed_job_asks_nothing(began, expected):
    assert kind(flow().step(began, 0.0)) is expected


def test_a_timeout_and_a_failed_join_fail_with_their_reason():
    f = flow()
    f.step(Began(), 0.0)
    assert f.step(Answered(TimedOut("no quorum")), 60.0) == Fail(Failure.TIMEOUT, "no quorum")
    assert f.step(Answered(None, error="superseded"), 60.0) == Fail(Failure.STATE, "superseded")
    assert kind(f.step(Answered("what"), 60.0)) is Failure.STATE


def test_a_round_that_does_not_hold_this_node_is_a_bug_not_a_rank():
    f = flow()
    f.step(Began(), 0.0)
    other = Round(number=3, epoch=1, members=(LEADER, 0x3), store_ip="198.18.0.1", store_port=5001)
    assert kind(f.step(Answered(Joined(other, Claim(1, LEADER), "198.18.0.1")), 1.0)) is Failure.STATE


@pytest.mark.parametrize(
    ("over", "had_round", "exits"),
    [
        (JobOver(was_waiting=True, end=JobEnd("finished"), ran=True), False, True),  # a spare never needed
        (JobOver(was_waiting=True, end=JobEnd("finished"), ran=False), False, False),  # no round ever formed
        (JobOver(was_waiting=True, end=JobEnd("x", failed=True), ran=True), False, False),  # the job failed
        (JobOver(was_waiting=False, end=JobEnd("finished")), False, False),  # it never saw the job open
        (JobOver(was_waiting=False, end=JobEnd("finished")), True, False),  # a member of a closed job
    ],
)
def test_only_a_spare_of_a_job_that_ran_and_finished_exits_0(over, had_round, exits):
    f = flow(had_round=had_round)
    f.step(Began(), 0.0)
    action = f.step(Answered(over), 1.0)
    assert isinstance(action, ExitClean) is exits
    assert exits or kind(action) is Failure.CLOSED


def test_a_health_check_runs_before_every_join_bounded_by_join_timeout():
    f = flow(health_check=True)
    assert f.step(Began(), 10.0) == CheckHealth(70.0)
    assert f.step(HealthChecked(ok=True), 15.0) == AskJoin(55.0)
    f.step(Answered(JOINED), 16.0)
    f.step(StoreFailed("reset", broke=True), 16.0)
    assert f.step(Told(), 16.0) == CheckHealth(70.0)
    assert f.step(HealthChecked(ok=False, why="exit 1"), 70.0) == Fail(Failure.HEALTH, "exit 1")
    assert kind(f.step(HealthChecked(ok=True, shut=True), 70.0)) is Failure.SHUT


def test_nodes_waiting_restarts_a_round_only_on_positive_knowledge_and_not_after_a_clean_close():
    key = ROUND.key
    diag = Diagnostics(node_id="2", job="job", role="following", round_key=key, nodes_waiting=1)
    assert nodes_waiting(None, False, diag) == 0  # no round yet
    assert nodes_waiting(key, False, diag) == 1
    assert nodes_waiting(key, True, diag) == 0  # the job closed: the workers finish
    failed = Diagnostics(
        node_id="2", job="job", role="following", status=Status(closed=True, failed="data path")
    )
    assert nodes_waiting(key, True, failed) == 1  # it failed: they stop
    older = Diagnostics(node_id="2", job="job", role="following", round_key=(1, LEADER, 2), nodes_waiting=3)
    assert nodes_waiting(key, False, older) == 0  # a snapshot from before the round knows nothing of it
