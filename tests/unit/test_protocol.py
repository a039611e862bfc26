"""The election core on a fake clock and an in-memory network that drops, duplicates and delays."""

from __future__ import annotations

import logging
import random

import pytest

from torch_mingle import _protocol
from torch_mingle._claims import (
    BecomeLeader,
    Claim,
    LeaderFound,
    LeaderLost,
    Role,
    SteppedDown,
    Succession,
    Timing,
)
from torch_mingle._errors import StateError
from torch_mingle._protocol import Discovery
from torch_mingle._records import Heard
from torch_mingle._wire import Announce, Codec, Datagram, MsgType, Probe, Query, Resign
from torch_mingle.testing.sim import Simulation

FAST = Timing(beacon_interval_s=0.5, leader_timeout_s=1.5)


def leader_claim(sim: Simulation) -> Claim:
    (leader,) = sim.leaders()
    assert leader.core.leader is not None
    return leader.core.leader.claim


NETWORKS = pytest.mark.parametrize(
    ("drop", "duplicate", "latency", "spread"),
    [
        (0.0, 0.0, (0.0002, 0.002), 0.0),
        (0.1, 0.1, (0.0002, 0.005), 0.2),
        (0.3, 0.2, (0.001, 0.02), 1.0),
    ],
)


@pytest.mark.parametrize("n", [2, 3, 5, 10, 30, 100, 200])
@NETWORKS
@pytest.mark.parametrize("seed", [1, 2])
def test_random_starts_converge_on_exactly_one_leader(n, drop, duplicate, latency, spread, seed):
    sim = Simulation(n, seed=seed, drop=drop, duplicate=duplicate, latency_s=latency, start_spread_s=spread)
    _converges_for_good(sim)


@pytest.mark.parametrize("n", [2, 3, 8, 30, 64])
@NETWORKS
@pytest.mark.parametrize("seed", [1, 2])
def test_a_small_job_that_knows_its_size_converges_on_one_leader_without_start_up_jitter(
    n, drop, duplicate, latency, spread, seed
):
    """What the handler runs (``expected_nodes = max_nodes``): up to 64 nodes query at once."""
    sim = Simulation(
        n,
        seed=seed,
        drop=drop,
        duplicate=duplicate,
        latency_s=latency,
        start_spread_s=spread,
        expect_all=True,
    )
    _converges_for_good(sim)


def _converges_for_good(sim: Simulation) -> None:
    converged_at = sim.run_until_converged(deadline=60.0)
    assert converged_at is not None, f"no single leader after 60 s: {len(sim.leaders())} leaders"
    claim = leader_claim(sim)
    assert all(node.core.leader and node.core.leader.claim == claim for node in sim.live())
    # Once converged it stays converged: the order of claims leaves nothing to fight over.
    sim.run_until(converged_at + 10.0)
    assert sim.converged()
    assert leader_claim(sim) == claim


def _alone_it_claims(timing: Timing, node: int = 50) -> Discovery:
    """A core that queried, heard nobody within its window, and claimed (``BecomeLeader``)."""
    core = Discovery("job", node, timing=timing)
    core.start(0.0)
    window = timing.election_window_s
    core.handle_timer(window)  # its query (the start-up jitter is at most half a window)
    core.handle_timer(2 * window)  # one window after the query: nobody answered
    assert [type(e) for e in core.events()] == [BecomeLeader]
    return core


def test_loss_free_start_elects_the_lowest_node_id_without_conflict():
    sim = Simulation(20, seed=5)
    assert sim.run_until_converged(deadline=5.0) is not None
    lowest = min(sim.nodes, key=lambda n: n.core.node_id)
    assert sim.leaders() == [lowest]
    assert leader_claim(sim).epoch == 1
    assert not any(isinstance(ev, SteppedDown) for node in sim.nodes for _, ev in node.events)


@pytest.mark.parametrize("seed", range(5))
def test_late_joiners_adopt_the_existing_leader_in_one_round_trip(seed):
    sim = Simulation(4, seed=seed, latency_s=(0.0005, 0.001))
    t0 = sim.run_until_converged(deadline=5.0)
    assert t0 is not None
    claim = leader_claim(sim)
    late = [sim.add_node(t0 + 0.5 + 0.1 * i) for i in range(20)]
    sim.run_until(t0 + 5.0)
    assert sim.converged()
    assert leader_claim(sim) == claim
    for node in late:
        assert not any(isinstance(ev, BecomeLeader) for _, ev in node.events)
        found = [t for t, ev in node.events if isinstance(ev, LeaderFound)]
        assert found, "late joiner never found the leader"
        # Ask-and-answer: the start-up jitter and two one-way trips, not a wait for the beacon.
        assert found[0] - node.start_at <= sim.timing.startup_jitter_s + 0.0025


def test_late_joiners_adopt_the_leader_under_loss():
    sim = Simulation(3, seed=9, drop=0.3, duplicate=0.1, timing=FAST)
    t0 = sim.run_until_converged(deadline=10.0)
    assert t0 is not None
    for i in range(30):
        sim.add_node(t0 + 0.05 * i)
    assert sim.run_until_converged(deadline=t0 + 30.0) is not None


def test_leader_death_elects_a_new_leader_with_a_higher_epoch():
    sim = Simulation(5, seed=3, timing=FAST)
    t0 = sim.run_until_converged(deadline=5.0)
    assert t0 is not None
    old = leader_claim(sim)
    (dead,) = sim.leaders()
    sim.kill(dead)
    t1 = sim.run_until_converged(deadline=t0 + 10.0)
    assert t1 is not None
    new = leader_claim(sim)
    assert new.epoch == old.epoch + 1
    assert new.leader != old.leader
    assert t1 - t0 <= FAST.leader_timeout_s + 1.0
    for node in sim.live():
        assert any(isinstance(ev, LeaderLost) and ev.claim == old for _, ev in node.events)


def test_a_stale_leader_is_never_followed_again():
    sim = Simulation(4, seed=11, timing=FAST)
    t0 = sim.run_until_converged(deadline=5.0)
    assert t0 is not None
    (old_leader,) = sim.leaders()
    old = leader_claim(sim)
    stale = Codec().encode(
        Datagram(
            job=sim.job,
            sender=old.leader,
            body=Announce(epoch=old.epoch, store_ip="10.9.9.9", store_port=4242),
            sent_ms=0,
            nonce=1,
        )
    )
    sim.kill(old_leader)
    t1 = sim.run_until_converged(deadline=t0 + 10.0)
    assert t1 is not None
    new = leader_claim(sim)
    # A delayed or replayed announcement of the dead leader arrives at every survivor.
    sim.net.attach(old_leader.addr)
    sim.net.send(old_leader.addr, stale, None, sim.now)
    sim.net.detach(old_leader.addr)
    sim.run_until(sim.now + 1.0)
    assert sim.converged()
    assert leader_claim(sim) == new
    assert all(n.core.stats.stale_claims >= 1 for n in sim.live() if n.core.role is Role.FOLLOWING)


def test_a_reported_leader_failure_suspects_that_claim():
    sim = Simulation(3, seed=4, timing=FAST)
    assert sim.run_until_converged(deadline=5.0) is not None
    old = leader_claim(sim)
    follower = next(n for n in sim.live() if n.core.role is Role.FOLLOWING)
    follower.core.leader_failed(sim.now, old, "store refused the connection")
    assert follower.core.role is Role.DISCOVERING
    assert old in follower.core._suspected_claims
    sim.run_until(sim.now + 5.0)
    # The old leader is alive, so the follower that suspects it elects itself with a higher epoch and
    # the whole job moves to that better claim: never two leaders for long, never a stale one.
    assert sim.converged()
    assert leader_claim(sim).beats(old)


def test_partition_then_heal_ends_under_one_leader():
    sim = Simulation(6, seed=21, timing=FAST)
    t0 = sim.run_until_converged(deadline=5.0)
    assert t0 is not None
    addrs = [n.addr for n in sim.nodes]
    sim.net.partition(addrs[:3], addrs[3:])
    sim.run_until(t0 + 5.0)
    assert len(sim.leaders()) == 2  # each side elected or kept one
    sim.net.heal()
    assert sim.run_until_converged(deadline=sim.now + 10.0) is not None
    assert len(sim.leaders()) == 1


def test_jobs_sharing_a_group_never_mix():
    sim = Simulation(3, seed=2)
    strangers = [sim.add_node(0.0, job="another-job") for _ in range(2)]
    converged = sim.run_until_converged(deadline=5.0)
    assert converged is not None
    sim.run_until(converged + 1.0)  # the other job's leader announces a few times meanwhile
    ours = {n.core.node_id for n in sim.live()}
    assert all(n.core.stats.other_jobs.get("another-job", 0) >= 1 for n in sim.live())
    assert all(n.core.leader and n.core.leader.claim.leader in ours for n in sim.live())
    # The other job elected its own leader among its own nodes.
    theirs = {n.core.node_id for n in strangers}
    assert all(n.core.leader and n.core.leader.claim.leader in theirs for n in strangers)


def test_invalid_datagrams_are_counted_and_logged_once_a_minute(caplog):
    core = Discovery("job", 7)
    core.start(0.0)
    with caplog.at_level(logging.WARNING, logger="torch_mingle._protocol"):
        for i in range(100):
            core.receive_datagram(b"garbage!" * 3, ("10.0.0.1", 9), 0.001 * i)
        core.receive_datagram(b"garbage!" * 3, ("10.0.0.1", 9), 61.0)
    assert core.stats.invalid["bad_magic"] == 101
    assert sum("bad_magic" in r.message for r in caplog.records) == 2


def test_every_role_handles_every_datagram_type():
    for role in Role:
        for kind in MsgType:
            assert (role, kind) in _protocol._TRANSITIONS, f"no transition for {kind.name} in {role.value}"


def test_a_missing_transition_names_the_state_and_the_event(monkeypatch):
    core = Discovery("job", 7)
    core.start(0.0)
    table = dict(_protocol._TRANSITIONS)
    del table[(Role.DISCOVERING, MsgType.RESIGN)]
    monkeypatch.setattr(_protocol, "_TRANSITIONS", table)
    data = Codec().encode(Datagram(job="job", sender=9, body=Resign(epoch=1)))
    with pytest.raises(StateError, match="RESIGN datagram in role discovering"):
        core.receive_datagram(data, None, 0.01)


@pytest.mark.parametrize("signed_ms_ago", [0, 10 * 60 * 1000])
def test_a_resignation_tells_which_rounds_of_the_job_ran_even_outside_the_replay_window(signed_ms_ago):
    # Swarm seed 62014562: a leader thawed, shut down and resigned; that was all a late node
    # ever got of the job, and it founded a first round beside the job's.
    key = b"k" * 32
    core = Discovery("job", 7, codec=Codec(key), wall_offset_s=1.7e9)
    core.start(0.0)
    now_ms = int((0.01 + 1.7e9) * 1000)
    resign = Resign(epoch=2, heard=((2, 0xC, 3), (1, 0xA, 1)))
    data = Codec(key).encode(Datagram("job", 9, resign, sent_ms=now_ms - signed_ms_ago, nonce=5))
    core.receive_datagram(data, None, 0.01)
    assert core.heard.keys == ((2, 0xC, 3), (1, 0xA, 1))


def test_a_resignation_names_the_rounds_its_term_knew_of_too():
    # The term's own rounds reach the core through its status (``update_status``), not what
    # it heard by datagram: the resignation, a late node's only word of the job, says both.
    core = _alone_it_claims(Timing(election_window_s=0.01))
    assert core.leader_ready(0.03, "10.0.0.5", 9)
    core.update_status(
        0.04, round=3, members=2, closed=False, min_nodes=1, max_nodes=2, established=True,
        heard=Heard(((1, 50, 3),), ((1, 50, 1),)),
    )  # fmt: skip
    core.datagrams_to_send(0.04)
    core.resign(0.05)
    (data, _), *_ = core.datagrams_to_send(0.05)
    got = Codec().decode(data)
    assert isinstance(got, Datagram) and isinstance(got.body, Resign)
    assert got.body.heard[0][:3] == (1, 50, 3)


def test_leader_ready_is_refused_after_a_better_claim_arrived():
    core = _alone_it_claims(Timing(election_window_s=0.01))
    better = Codec().encode(
        Datagram(job="job", sender=60, body=Announce(epoch=2, store_ip="10.0.0.6", store_port=7))
    )
    core.receive_datagram(better, ("10.0.0.6", 1), 0.021)
    assert core.leader_ready(0.022, "10.0.0.5", 9) is False
    assert core.role is Role.FOLLOWING


def test_a_node_whose_thread_ran_late_still_gives_the_leader_a_window_to_answer():
    # Its first timer runs long after its window (a starved thread): it queries then, and a
    # leader's answer that comes within one window of that query is followed, not out-claimed.
    core = Discovery("job", 0x10, timing=Timing(election_window_s=0.02))
    core.start(0.0)
    core.handle_timer(0.5)
    assert [type(e) for e in core.events()] == []  # it queried; it did not claim
    answer = Codec().encode(
        Datagram(job="job", sender=0x60, body=Announce(epoch=1, store_ip="10.0.0.6", store_port=7))
    )
    core.receive_datagram(answer, ("10.0.0.6", 1), 0.51)
    assert core.role is Role.FOLLOWING
    assert core.leader is not None and core.leader.claim.leader == 0x60


def test_when_many_start_together_only_a_handful_speak():
    sim = Simulation(300, seed=8)
    assert sim.run_until_converged(deadline=5.0) is not None
    speakers = [n for n in sim.nodes if n.core.stats.sent > 0]
    assert len(speakers) < 60, f"{len(speakers)} of 300 nodes sent datagrams"
    assert sim.datagrams_per_node() < 1.0


def test_a_silent_node_that_knows_a_newer_epoch_still_speaks():
    core = Discovery("job", 0x50, timing=Timing(startup_jitter_s=0.01))
    core.max_epoch_seen = 7  # e.g. it followed a leader of epoch 7 that just died
    core.start(0.0)
    better = Codec().encode(Datagram(job="job", sender=0x10, body=Query(epoch_seen=3)))
    core.receive_datagram(better, ("10.0.0.1", 1), 0.001)
    core.handle_timer(0.011)
    sent = core.datagrams_to_send(0.011)
    assert len(sent) == 1, "the node must tell the others about epoch 7"


def test_a_leader_answers_probes_of_any_job_within_a_rate_limit():
    core = _alone_it_claims(Timing(election_window_s=0.001, startup_jitter_s=0.0), node=0x10)
    assert core.leader_ready(0.002, "10.0.0.1", 4000)
    core.datagrams_to_send(0.002)
    probe = Codec().encode(Datagram(job="*", sender=0x99, body=Probe()))
    for _ in range(100):
        core.receive_datagram(probe, ("10.0.0.9", 5), 0.003)
    answers = [d for d, dest in core.datagrams_to_send(0.003) if dest == ("10.0.0.9", 5)]
    assert 1 <= len(answers) <= _protocol.PROBE_BURST
    decoded = Codec().decode(answers[0])
    assert isinstance(decoded, Datagram) and decoded.job == "job" and isinstance(decoded.body, Announce)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_when_every_node_of_the_job_has_spoken_the_election_does_not_wait_out_its_window(n):
    sim = Simulation(n, seed=3, expect_all=True)  # max_nodes = n: the whole job starts together
    converged_at = sim.run_until_converged(deadline=5.0)
    assert converged_at is not None
    assert converged_at < sim.timing.election_window_s
    lowest = min(sim.nodes, key=lambda node: node.core.node_id)
    assert sim.leaders() == [lowest]


@pytest.mark.parametrize("seed", range(5))
def test_a_winner_that_joins_last_hears_everyone_and_claims_without_waiting_out_its_window(seed):
    # Seven of eight nodes have spoken and wait; the eighth, which will win (lowest id), joins
    # the group after their queries. Their unicast greetings tell it that the whole job is here.
    sim = Simulation(7, seed=seed, max_nodes=8, expect_all=True)
    sim.run_until(0.012)
    assert all(node.core.stats.sent > 0 for node in sim.nodes) and not sim.leaders()
    sent_before = sum(node.core.stats.sent for node in sim.nodes)
    late = sim.add_node(0.012, node_id=1)
    converged_at = sim.run_until_converged(deadline=5.0)
    assert converged_at is not None and sim.leaders() == [late]
    assert converged_at - late.start_at < sim.timing.election_window_s  # it used to wait it out
    # One greeting from each waiting node, the queries and the leader's announcement: no
    # storm (a greeting is never answered by one, so they cannot ping-pong).
    assert sum(node.core.stats.sent for node in sim.nodes) - sent_before <= 3 * 8


def test_a_new_claim_never_announces_the_standing_of_the_nodes_previous_term():
    # A leader whose round formed (established) steps down before an established epoch 2,
    # then loses that leader by silence (a connect after its link came back found no route)
    # and claims epoch 3. That claim is bare: announcing the old term's "established" would
    # depose the running epoch-2 leader and restart its healthy round.
    codec = Codec()
    core = _alone_it_claims(Timing(election_window_s=0.01, leader_timeout_s=1.0))
    assert core.leader_ready(0.021, "10.0.0.5", 9)
    core.update_status(0.022, round=1, members=3, closed=False, min_nodes=2, max_nodes=3,
                       established=True, followers=2)  # fmt: skip
    newer = Announce(epoch=2, store_ip="10.0.0.6", store_port=7, round=2, members=3, established=True)
    core.receive_datagram(codec.encode(Datagram(job="job", sender=60, body=newer)), ("10.0.0.6", 1), 1.0)
    assert core.role is Role.FOLLOWING and SteppedDown in [type(e) for e in core.events()]
    core.datagrams_to_send(1.0)
    assert core.leader is not None
    core.leader_failed(1.1, core.leader.claim, "cannot connect: no route to host")
    t = 1.1

    def role() -> Role:  # read afresh (the timers change it)
        return core.role

    while role() is not Role.CLAIMING and t < 60.0:  # it holds its claims a while first
        t = max(t, core.next_timer() or t + 0.1)
        core.handle_timer(t)
    assert role() is Role.CLAIMING and core.leader_ready(t, "10.0.0.5", 11)
    sent = [codec.decode(data) for data, _ in core.datagrams_to_send(t)]
    announced = [d.body for d in sent if isinstance(d, Datagram) and isinstance(d.body, Announce)]
    assert announced and all(a.epoch == 3 for a in announced)
    assert not any(a.established or a.followers or a.round for a in announced), announced


def test_in_a_small_job_the_first_query_goes_out_at_once_and_a_crowd_waits_its_jitter():
    """The start-up jitter lets a crowd stay silent behind a better candidate; in a small job
    everyone speaks anyway, and a late joiner would only wait (the last node of a round)."""
    timing = Timing(startup_jitter_s=0.01)
    small = Discovery("job", 0x50, timing=timing, expected_nodes=8, rng=random.Random(3))
    crowd = Discovery("job", 0x50, timing=timing, expected_nodes=1000, rng=random.Random(3))
    for core in (small, crowd):
        core.start(0.0)
        if core.next_timer() == 0.0:
            core.handle_timer(0.0)
    sent = [Codec().decode(data) for data, _ in small.datagrams_to_send(0.0)]
    assert [type(d.body) for d in sent if isinstance(d, Datagram)] == [Query]
    assert len(sent) == 1
    assert crowd.datagrams_to_send(0.0) == []
    assert 0.0 < (crowd.next_timer() or 0.0) <= 0.01


def test_a_member_of_a_round_is_not_taken_away_by_a_bare_claim_of_the_same_epoch():
    """A node that started just after the first round formed heard no leader within its window
    and claims the same epoch (seen with four torchrun agents on two busy cores). The round's
    members know their leader formed a round (they are in it) even before its rate-limited
    announcement says "established": a bare claim with a lower node id does not take them."""
    codec = Codec()
    core = Discovery("job", 0x500, timing=Timing(election_window_s=0.02))
    core.start(0.0)
    leader = Claim(epoch=1, leader=0x800)
    first = Announce(epoch=1, store_ip="10.0.0.8", store_port=7)  # sent before its round formed
    core.receive_datagram(codec.encode(Datagram(job="job", sender=0x800, body=first)), ("10.0.0.8", 1), 0.01)
    assert core.role is Role.FOLLOWING and core.leader is not None and core.leader.claim == leader
    core.set_succession(
        Succession(leader, 1, (0x800, 0x500), ("10.0.0.8", "10.0.0.5"), (1, 1), seen_via="10.0.0.8")
    )
    bare = Announce(epoch=1, store_ip="10.0.0.1", store_port=9)
    core.receive_datagram(codec.encode(Datagram(job="job", sender=0x100, body=bare)), ("10.0.0.1", 1), 0.05)
    assert core.leader is not None and core.leader.claim == leader, core.leader
