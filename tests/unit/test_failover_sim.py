"""Failover of whole nodes (election, term, session) on the simulated network and fake clock.

The nodes are the production ``Node``; ``Agents`` plays torch's elastic agent: it re-joins
whenever ``num_nodes_waiting()`` says so, as the agent's monitor loop does.
"""

from __future__ import annotations

import random

import pytest

from torch_mingle._claims import BecomeLeader, Dest, LeaderFound, LeaderLost, SteppedDown, Timing
from torch_mingle._view import Joined
from torch_mingle._wire import derive_key
from torch_mingle.testing import agents
from torch_mingle.testing.net import Route
from torch_mingle.testing.sim import SimNode, Simulation

FAST = Timing(beacon_interval_s=1.0, leader_timeout_s=3.0, suspect_ttl_s=3.0, successor_wait_s=1.25)


class Agents(agents.TorchAgents):
    """torch's agents (``testing.agents``), with the rounds they ran: (time, round, members)."""

    def __init__(self, sim: Simulation, nodes: list[SimNode]) -> None:
        super().__init__(sim)
        self.rounds: list[tuple[float, int, tuple[int, ...]]] = []
        for node in nodes:
            self.start(node.index, node, node.start_at)

    def delivered(self, agent: agents.Agent, joined: Joined) -> None:
        super().delivered(agent, joined)
        rnd = joined.round
        if not self.rounds or self.rounds[-1][1] != rnd.number:
            self.rounds.append((self.sim.now, rnd.number, rnd.members))

    def round_formed_after(self, t: float) -> tuple[float, int, tuple[int, ...]] | None:
        return next((r for r in self.rounds if r[0] > t), None)


def _running(n: int, *, seed: int = 1, rejoin_delay_s: float = 10.0, **kw) -> tuple[Simulation, Agents]:
    sim = Simulation(n, seed=seed, timing=FAST, min_nodes=2, max_nodes=n, last_call_timeout_s=0.5,
                     rejoin_delay_s=rejoin_delay_s, **kw)  # fmt: skip
    agents = Agents(sim, list(sim.nodes))
    agents.run_until(3.0)
    assert agents.rounds and len(agents.rounds[-1][2]) == n, agents.rounds
    return sim, agents


def test_a_frozen_follower_that_returns_does_not_undo_the_fresh_round():
    sim, agents = _running(5)
    (leader,) = sim.leaders()
    frozen = next(n for n in sim.nodes if n is not leader)
    t0 = sim.now
    sim.freeze(frozen)
    agents.run_until(t0 + 4.5)
    sim.thaw(frozen)  # back 4.5 s later, after the others re-formed without it
    agents.run_until(t0 + 30.0)
    second = agents.round_formed_after(t0)
    assert second is not None and frozen.core.node_id not in second[2]
    assert second[0] - t0 <= FAST.leader_timeout_s + 0.5  # dropped after the heartbeat timeout
    third = agents.round_formed_after(second[0])
    assert third is not None and frozen.core.node_id in third[2]  # it is admitted again, later
    assert third[0] - second[0] >= 10.0, "the returning node restarted the fresh round at once"


def test_a_node_that_flaps_again_and_again_waits_longer_each_time():
    sim, agents = _running(3, rejoin_delay_s=5.0)
    (leader,) = sim.leaders()
    flapper = next(n for n in sim.nodes if n is not leader)
    gaps = []
    for _ in range(3):
        t0 = sim.now
        sim.freeze(flapper)
        agents.run_until(t0 + 4.0)
        sim.thaw(flapper)
        agents.run_until(t0 + 60.0)
        without = agents.round_formed_after(t0)
        back = agents.round_formed_after(without[0]) if without else None
        assert without is not None and back is not None, agents.rounds
        gaps.append(back[0] - without[0])
    assert gaps[0] >= 5.0 and gaps[1] >= 10.0 and gaps[2] >= 20.0, gaps
    assert not any(isinstance(ev, SteppedDown) for _, ev in leader.events)


def test_a_frozen_leader_is_replaced_and_stays_out_when_it_returns():
    sim, agents = _running(4)
    (old,) = sim.leaders()
    t0 = sim.now
    sim.freeze(old)
    agents.run_until(t0 + 6.0)
    new = agents.round_formed_after(t0)
    assert new is not None and old.core.node_id not in new[2]
    assert new[0] - t0 <= FAST.leader_timeout_s + 0.5
    rounds_before = len(agents.rounds)
    sim.thaw(old)
    agents.run_until(new[0] + 9.0)  # within rejoin_delay (10 s) of the fresh round
    assert any(isinstance(ev, SteppedDown) for _, ev in old.events)
    assert len(agents.rounds) == rounds_before, "the returning leader restarted the fresh round"
    (leader,) = sim.leaders()
    assert leader is not old and leader.core.leader is not None and leader.core.leader.claim.epoch == 2
    agents.run_until(new[0] + 15.0)
    back = agents.round_formed_after(new[0])
    assert back is not None and back[2][0] != old.core.node_id and old.core.node_id in back[2]


def test_an_agent_woken_by_the_cut_of_its_frozen_leaders_store_reads_that_its_round_is_over():
    """The cut wakes an agent blocked on the frozen store; if the board still showed its round
    running, it would try that store again and block there for as long as the leader is frozen."""
    sim, agents = _running(4)
    (old,) = sim.leaders()
    t0 = sim.now
    sim.freeze(old)
    agents.run_until(t0 + 6.0)
    assert agents.round_formed_after(t0) is not None
    for node in sim.nodes:
        if node is old:
            continue
        assert node.net is not None
        ended = [cut for cut in node.net.cuts if cut[2]]
        assert ended, f"{node.node.label} did not cut its lost leader's round store"
        published = all(trouble for _, _, _, trouble in ended)
        assert published, f"{node.node.label} cut before it published: {ended}"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_member_that_hears_the_successor_before_its_own_timeout_leaves_the_old_round_too(seed):
    """A member whose last frame from the frozen leader came later than the others' (a late
    ack, a loop that stalled) still follows that leader when the others' successor, now
    established, announces: the switch must end its round as losing the leader does (the
    agent restarts into the new round, the old stores are cut), or its agent waits forever."""
    sim, agents = _running(5, seed=seed)
    (old,) = sim.leaders()
    late = next(n for n in sim.nodes if n.core.node_id == agents.rounds[-1][2][-1])  # not the successor
    t0 = sim.now
    sim.freeze(late)  # it reads the leader's last frames late: its clock on the leader starts later
    agents.run_until(t0 + 0.9)
    sim.freeze(old)
    agents.run_until(t0 + 1.5)
    sim.thaw(late)
    agents.run_until(t0 + 8.0)
    seen = [ev for at, ev in late.events if at > t0 and isinstance(ev, LeaderFound | LeaderLost)]
    assert seen and isinstance(seen[0], LeaderFound), f"it lost the leader by itself: nothing tested {seen}"
    new = agents.round_formed_after(t0)
    assert new is not None, agents.rounds
    assert late.core.node_id in new[2] and old.core.node_id not in new[2], (new, agents.rounds)
    assert late.net is not None
    assert any(ended and trouble for _, _, ended, trouble in late.net.cuts), late.net.cuts


@pytest.mark.parametrize("drop", [0.0, 0.05, 0.10])
def test_late_joiners_whose_answers_are_slow_never_depose_the_running_leader(drop):
    """600 late joiners per case hear the leader only after 25-100 ms: later than their election window.

    Each one arrives, asks for a place (it becomes a spare), and leaves again; the running
    leader must stay the leader through all of them, and none may take a member's place.
    """
    holder: dict[str, object] = {"late": None}

    def slow_leader(src: object, dst: object, data: bytes, rng: random.Random) -> Route | None:
        if src == holder.get("leader") and dst == holder["late"]:
            return Route(delays=(rng.uniform(0.025, 0.1),))
        return None

    sim = Simulation(3, seed=7, timing=FAST, drop=drop, route_hook=slow_leader, min_nodes=3, max_nodes=3)
    first = [sim.join(n) for n in sim.nodes]
    assert sim.run_until_done(first, deadline=5.0)
    (leader,) = sim.leaders()
    claim = leader.core.leader.claim if leader.core.leader else None
    holder["leader"] = leader.addr
    claimed = 0
    for _ in range(600):
        node = sim.add_node(sim.now + 0.001)
        holder["late"] = node.addr
        sim.run_until(node.start_at + 0.0005)
        ticket = sim.join(node, timeout_s=300)
        sim.run_until(sim.now + 0.4)
        claimed += any(isinstance(ev, BecomeLeader) for _, ev in node.events)
        assert not (ticket.done and isinstance(ticket.result, Joined)), "a late spare took a member's place"
        assert node.core.leader is not None and node.core.leader.claim == claim, (
            "a late joiner did not follow"
        )
        sim.kill(node)
    assert not any(isinstance(ev, SteppedDown) for _, ev in leader.events)
    assert sim.leaders() == [leader] and leader.core.leader is not None and leader.core.leader.claim == claim
    print(f"loss {drop:.0%}: {claimed} of 600 late joiners claimed before hearing the leader; none won")


def test_before_the_first_round_a_late_joiner_never_deposes_a_followed_leader():
    """Nothing is established before the first round: 200 late joiners hear the leader too late.

    Each one claims epoch 1 (it heard no epoch) and half of them have a lower node id than
    the leader; the leader's followers outweigh such a claim, so it stays the leader.
    """
    holder: dict[str, object] = {"late": None}

    def slow_leader(src: object, dst: object, data: bytes, rng: random.Random) -> Route | None:
        if src == holder.get("leader") and dst == holder["late"]:
            return Route(delays=(rng.uniform(0.025, 0.1),))
        return None

    sim = Simulation(6, seed=11, timing=FAST, route_hook=slow_leader, min_nodes=4, max_nodes=300)
    assert sim.run_until_converged(deadline=5.0) is not None
    sim.run_until(sim.now + 0.5)  # the followers' control connections are up
    (leader,) = sim.leaders()
    claim = leader.core.leader.claim if leader.core.leader else None
    assert claim is not None and claim.epoch == 1
    holder["leader"] = leader.addr
    claimed = lower = 0
    for _ in range(200):
        node = sim.add_node(sim.now + 0.001)
        holder["late"] = node.addr
        sim.run_until(node.start_at + 0.4)
        claimed += any(isinstance(ev, BecomeLeader) for _, ev in node.events)
        lower += node.core.node_id < claim.leader
        assert node.core.leader is not None and node.core.leader.claim == claim, "a late one did not follow"
    assert not any(isinstance(ev, SteppedDown) for _, ev in leader.events)
    assert sim.leaders() == [leader]
    assert claimed > 20 and lower > 20, (claimed, lower)  # the case happened, many times


def _claims_after(sim: Simulation, t: float) -> list[tuple[float, SimNode]]:
    return sorted(
        (at, n) for n in sim.nodes for at, ev in n.events if at > t and isinstance(ev, BecomeLeader)
    )


@pytest.mark.parametrize("fault", ["kill", "freeze"])
@pytest.mark.parametrize("multicast", [True, False])
def test_the_next_member_in_rank_order_takes_over_and_only_it_claims(fault, multicast):
    sim, agents = _running(8, seed=3)
    (old,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    successor = next(n for n in sim.nodes if n.core.node_id == ranks[1])
    sim.net.multicast = multicast  # off: a snooping switch forgot the group since the round formed
    t0 = sim.now
    getattr(sim, fault)(old)
    agents.run_until(t0 + FAST.leader_timeout_s + FAST.successor_wait_s + 2.0)
    new = agents.round_formed_after(t0)
    assert new is not None, f"no round after the leader's loss; rounds {agents.rounds}"
    assert sorted(new[2]) == sorted(set(ranks) - {old.core.node_id})
    assert new[2][0] == successor.core.node_id
    assert new[0] - t0 <= FAST.leader_timeout_s + 1.0
    assert [n for _, n in _claims_after(sim, t0)] == [successor], "a member other than the successor claimed"


def test_when_the_successor_is_gone_too_the_member_after_it_takes_over():
    sim, agents = _running(6, seed=4)
    (old,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    by_id = {n.core.node_id: n for n in sim.nodes}
    sim.net.multicast = False
    t0 = sim.now
    sim.freeze(by_id[ranks[1]])  # the successor, silently: the others wait for it, then pass it
    sim.kill(old)
    agents.run_until(t0 + FAST.leader_timeout_s + 2 * FAST.successor_wait_s + 3.0)
    new = agents.round_formed_after(t0)
    assert new is not None, f"no round after the leader's loss; rounds {agents.rounds}"
    assert new[2][0] == ranks[2] and set(new[2]) == set(ranks[2:])
    assert new[0] - t0 <= FAST.successor_wait_s + 2.0  # a kill is seen at once; the freeze costs one wait


@pytest.mark.parametrize("who", ["leader", "follower"])
def test_a_preempted_node_leaves_and_the_others_re_form_without_a_timeout(who):
    sim, agents = _running(4, seed=5)
    (leader,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    victim = leader if who == "leader" else next(n for n in sim.nodes if n is not leader)
    t0 = sim.now
    agent = agents.by_host[victim.index]
    agents.preempt(agent)  # its agent stops once the leave returns
    ticket = agent.ticket
    assert ticket is not None
    agents.run_until(t0 + 1.0)
    new = agents.round_formed_after(t0)
    assert new is not None, f"no round within 1 s of the leave; rounds {agents.rounds}"
    assert set(new[2]) == set(ranks) - {victim.core.node_id}
    assert ticket.done and ticket.error is None
    if who == "leader":
        assert new[2][0] == ranks[1]  # the next member in rank order took over


def test_several_dead_successors_in_a_row_are_passed_over_not_waited_for_in_circles():
    # Four successors silent: passing them takes 4 x 1.25 s, longer than a suspicion lasts (3 s).
    # (12 nodes: the 7 left are still a majority of the 11 that vote.)
    sim, agents = _running(12, seed=6)
    (old,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    by_id = {n.core.node_id: n for n in sim.nodes}
    for node in ranks[1:5]:
        sim.freeze(by_id[node])
    t0 = sim.now
    sim.kill(old)
    agents.run_until(t0 + 4 * FAST.successor_wait_s + 4.0)
    new = agents.round_formed_after(t0)
    assert new is not None, f"no round after the leader's loss; rounds {agents.rounds}"
    assert new[2][0] == ranks[5] and set(new[2]) == set(ranks[5:])


def test_a_node_that_left_does_not_vote_after_its_leader_left_too():
    """Two of three preempted together: the leader hands over saying who left, so the one
    node left (min_nodes=1) has every vote there is and goes on."""
    sim = Simulation(3, seed=7, timing=FAST, min_nodes=1, max_nodes=3, last_call_timeout_s=0.5)
    agents = Agents(sim, list(sim.nodes))
    agents.run_until(3.0)
    (leader,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    other = next(n for n in sim.nodes if n is not leader and n.core.node_id != ranks[1])
    for victim in (other, leader):
        agents.preempt(agents.by_host[victim.index])
    t0 = sim.now
    agents.run_until(t0 + 3.0)
    last = agents.rounds[-1]
    assert last[0] > t0 and last[2] == (ranks[1],), agents.rounds


@pytest.mark.parametrize("multicast", [True, False])
def test_a_takeover_sends_the_group_a_handful_of_datagrams_whatever_the_round_size(multicast):
    """A new leader's traffic to the group must not grow with its round: one query, one
    announcement, status changes at most every ``query_mcast_gap_s``; no burst, no multicast
    copy of a member's query, unicast announcements only to members that do not follow it."""
    n = 64
    sim, agents = _running(n, seed=7)
    (old,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    successor = next(node for node in sim.nodes if node.core.node_id == ranks[1])
    net = successor.net
    assert net is not None
    sent: list[tuple[float, Dest]] = []
    send = net.send_datagram

    def spy(data: bytes, dest: Dest) -> None:
        sent.append((sim.now, dest))
        send(data, dest)

    net.send_datagram = spy  # type: ignore[method-assign]
    sim.net.multicast = multicast
    t0 = sim.now
    sim.freeze(old)
    agents.run_until(t0 + FAST.leader_timeout_s + FAST.successor_wait_s + 2.0)
    new = agents.round_formed_after(t0)
    assert new is not None, f"no round after the leader's loss; rounds {agents.rounds}"
    assert new[2][0] == successor.core.node_id
    until_round = [dest for at, dest in sent if at <= new[0]]
    to_group = sum(dest is None for dest in until_round)
    unicast = len(until_round) - to_group
    # Measured: 3 (multicast on) and 4; before, 6 (five queries at 10 ms doubling, a burst).
    assert to_group <= 4, f"{to_group} datagrams to the group before the round formed"
    if multicast:  # every member followed by multicast: the unicast fan-out skipped them all
        assert unicast <= n // 8, f"{unicast} unicast datagrams to {n - 2} members"  # before: 62
    else:  # each member learned of it by unicast, once or twice (its own query answered)
        assert n - 2 <= unicast <= 3 * n, f"{unicast} unicast datagrams to {n - 2} members"


@pytest.mark.parametrize("who", ["the successor", "another member"])
def test_a_node_that_shuts_down_between_two_leaders_tells_the_next_one_that_the_job_closed(who):
    """torch's agent calls shutdown() when it is done, to close the rendezvous for every node
    (as c10d does); a node whose leader was just lost must tell the next leader, not drop it.
    The successor in rank order does not lead then: it would resign at once, heard by nobody."""
    sim, agents = _running(4)
    (old,) = sim.leaders()
    ranks = agents.rounds[-1][2]
    by_id = {n.core.node_id: n for n in sim.nodes}
    done = by_id[ranks[1]] if who == "the successor" else by_id[ranks[2]]
    rest = [n for n in sim.nodes if n is not old and n is not done]
    t0 = sim.now
    sim.kill(old)
    agents.run_until(t0 + 0.005)  # the resets arrived: every survivor is between leaders
    assert done.node.session is None and done.node.term is None, "not between leaders: nothing tested"
    shutdown = sim.leave(done, close_timeout_s=30.0)
    sim.run_until(t0 + FAST.successor_wait_s + 2.0)
    assert shutdown.done and shutdown.result is True
    assert all(n.node.job_closed for n in rest), [(n.node.label, n.node.job_closed) for n in rest]


def test_a_new_process_of_a_leader_starts_its_election_above_the_term_it_led():
    """What the leader's node saved says which epoch it led (``NodeState.led``), recorded before
    the term began: its next process never claims that (epoch, node) again."""
    sim, _ = _running(3, seed=2)
    (old,) = sim.leaders()
    epoch = old.node.term.claim.epoch if old.node.term is not None else 0
    assert epoch >= 1 and sim.saved[old.node.settings.node_id].led == epoch
    sim.kill(old)
    new = sim.restart(old, sim.now + 0.1, node_id=old.node.settings.node_id)
    assert new.node.core.max_epoch_seen >= epoch


def test_a_spare_that_joined_before_the_first_round_never_founds_a_job_of_its_own():
    """It waited (parked) while round 1 ran without it, then was cut off alone with
    ``min_nodes=1``: it heard that the job ran, so alone it forms nothing (it formed an epoch 2
    round 1 that took the job over at the heal: the "wait" said no round, and its join neither)."""
    sim = Simulation(3, seed=7, timing=FAST, min_nodes=1, max_nodes=2, last_call_timeout_s=0.5)
    agents = Agents(sim, list(sim.nodes))
    agents.run_until(3.0)
    assert agents.rounds and len(agents.rounds[-1][2]) == 2, agents.rounds
    members = set(agents.rounds[-1][2])
    (spare,) = [n for n in sim.nodes if n.core.node_id not in members]
    assert spare.node.joining.parked
    t0 = sim.now
    sim.net.partition([n.addr for n in sim.nodes if n is not spare], [spare.addr])
    agents.run_until(t0 + 30.0)
    ticket = agents.by_host[spare.index].ticket
    assert ticket is not None and not ticket.done, "the spare alone formed a round of its own"
    assert all(spare.core.node_id not in r[2] for r in agents.rounds)


def test_a_spare_restarted_while_cut_off_still_knows_that_the_job_ran():
    """A spare that joined before round 1 is taken in, later, on that same join, without its
    vote: what it heard while it waited goes to its state file (``Ballot.remember``), so a new
    process of it, cut off alone with ``min_nodes=1``, founds no job of its own either."""
    sim = Simulation(3, seed=7, timing=FAST, min_nodes=1, max_nodes=2, last_call_timeout_s=0.5)
    agents = Agents(sim, list(sim.nodes))
    agents.run_until(3.0)
    members = set(agents.rounds[-1][2])
    (spare,) = [n for n in sim.nodes if n.core.node_id not in members]
    assert spare.node.joining.parked
    assert sim.saved[spare.core.node_id].heard.round >= 1  # written as it waited, not at its join
    sim.net.partition([n.addr for n in sim.nodes if n is not spare], [spare.addr])
    sim.kill(spare)
    t0 = sim.now + 0.5
    new = sim.restart(spare, t0, node_id=spare.core.node_id)
    agents.start(spare.index, new, t0)
    agents.run_until(t0 + 30.0)
    assert new.node.core.heard.round >= 1
    assert all(new.core.node_id not in r[2] for r in agents.rounds if r[0] > t0), "alone, it formed a round"


def test_a_restarted_process_draws_nonces_of_its_own():
    """Production seeds each process's nonces from the OS. The simulator must not give a new
    process of a node its predecessor's: every node that heard the old one would drop the new
    one's datagrams as replays (a long swarm seed, 3000, found it: a node restarted at 1,256 s
    of simulated time was unheard in the election that followed its leader's death at 2,920 s,
    and the job split between two claims)."""
    sim, _ = _running(3, seed=3, key=derive_key(b"a-secret"))
    (old,) = sim.leaders()  # it sent datagrams (its announcements) that the others remember
    sim.kill(old)
    new = sim.restart(old, sim.now + 0.1, node_id=old.node.settings.node_id)
    sim.run_until(sim.now + 3.0)
    assert new.core.stats.sent > 0, "the new process sent nothing: nothing tested"
    replayed = {n.node.label: n.core.stats.invalid.get("replayed", 0) for n in sim.nodes if n.alive}
    assert not any(replayed.values()), replayed


@pytest.mark.parametrize("who", ["a member", "the leader"])
def test_a_node_whose_disk_refuses_its_vote_stops_before_it_goes_out_and_the_others_go_on(who):
    """A node whose state directory can neither be written nor cleared (``Identity.save``)
    cannot keep its word: it stops (``_ready.StateNotRecorded``) before anything it decided in
    that step leaves it, its agent is told why, and the others form their rounds without it."""

    def cluster() -> Simulation:
        return Simulation(3, seed=7, timing=FAST, min_nodes=2, max_nodes=3, last_call_timeout_s=0.5)

    probe = cluster()
    Agents(probe, list(probe.nodes)).run_until(3.0)
    (leader,) = probe.leaders()
    sim = cluster()
    broken = sim.nodes[leader.index if who == "the leader" else (leader.index + 1) % 3]
    assert broken.net is not None and broken.board is not None
    broken.net.persist = lambda state: False  # type: ignore[method-assign]
    agents = Agents(sim, list(sim.nodes))
    agents.run_until(15.0)
    assert not broken.alive
    assert "state directory" in (broken.board.diagnostics().last_error or "")
    assert broken.core.node_id not in sim.saved  # nothing of it was written, nor went out
    assert agents.rounds, "no round formed"
    assert all(broken.core.node_id not in members for _, _, members in agents.rounds), agents.rounds


def test_a_spare_that_hears_only_the_announcement_of_a_failed_job_fails_and_does_not_exit_0():
    """Its control connection cut while the job closed as failed (a member's agent failed), the
    spare learns the close from the leader's announcement alone once the cut heals; that says
    the job failed (``Announce.failed``), so the spare fails too. It said only "closed", and the
    spare exited 0 as if the job had finished (swarm seed 2708)."""
    sim = Simulation(3, seed=7, timing=FAST, min_nodes=1, max_nodes=2, last_call_timeout_s=0.5)
    agents = Agents(sim, list(sim.nodes))
    exits: list[str] = []
    agents.exited_clean = lambda agent, clean: exits.append(clean.why)  # type: ignore[method-assign]
    fails: list[str] = []
    agents.failed = lambda agent, fail: fails.append(fail.why)  # type: ignore[method-assign]
    agents.run_until(3.0)
    members = set(agents.rounds[-1][2])
    (spare,) = [n for n in sim.nodes if n.core.node_id not in members]
    assert spare.node.joining.parked
    cut = [(spare.addr, n.addr) for n in sim.nodes if n is not spare]
    sim.net.block(1, cut + [(b, a) for a, b in cut])
    agents.run_until(sim.now + 10.0)  # its session to the leader is lost meanwhile
    (member, *_) = [a for a in agents.agents if a.node is not spare]
    agents.shut(member, failed="its workers failed")
    agents.run_until(sim.now + 2.0)
    sim.net.unblock(1, sim.now)
    agents.run_until(sim.now + 10.0)
    assert not exits, f"the spare exited 0 after a failed job: {exits}"
    assert any("the job failed" in why for why in fails), fails


def test_a_leader_that_cannot_record_its_own_vote_elects_again_and_the_job_forms(monkeypatch):
    """A leader whose own node refuses its term's first round (it knows a round the term did
    not account for) gives the lead up and elects again as any node does; before, its
    election stopped for good and its agent waited for a leader it could no longer hear of."""
    from torch_mingle._node import Node
    from torch_mingle.testing.transcript import World

    sound, refused = Node.vote, list[int]()

    def vote(self, rnd, base, covers):
        if self.term is not None and not refused:
            refused.append(self.settings.node_id)
            return False
        return sound(self, rnd, base, covers)

    monkeypatch.setattr(Node, "vote", vote)
    world = World(3, min_nodes=3, max_nodes=3, seed=5, secret=False)
    assert world.stabilize(60.0), "\n".join(world.out)
    assert refused
    leader = next(n for n in world.sim.nodes if n.core.node_id == refused[0])
    assert leader.core.role.value != "stopped"
