"""A node's identity across restarts of its agent (``_identity``): a dead agent's slot, id and
vote go to the next agent on its host; a frozen agent's never do."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from torch_mingle import _identity
from torch_mingle._ballot import MAX_EARLIER, Ballot, NodeState
from torch_mingle._identity import Identity
from torch_mingle._records import NOTHING_HEARD, History, Round
from torch_mingle.errors import MingleConfigError

HOLDER = """
import sys, time
from pathlib import Path
from torch_mingle import _identity
from torch_mingle._identity import Identity
from torch_mingle._ballot import NodeState
from torch_mingle._rounds import History
ident = Identity.claim(Path(sys.argv[1]), "job42")
ident.save(NodeState(History(epoch=2, round=5, members=(ident.node_id, 7)), None))
print(f"{ident.node_id:x} {ident.incarnation}", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """An agent process that claimed a slot of job42, voted, and holds it (until killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # also ends a stopped process
        proc.wait(timeout=30)


def _claimed(proc: subprocess.Popen[str]) -> tuple[int, int]:
    assert proc.stdout is not None
    node, incarnation = proc.stdout.readline().split()
    return int(node, 16), int(incarnation)


def test_an_agent_started_after_one_died_takes_its_node_id_and_vote(tmp_path, holder):
    dead_id, incarnation = _claimed(holder)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)  # its kernel released its lock
    ident = Identity.claim(tmp_path, "job42")
    assert (ident.node_id, ident.incarnation) == (dead_id, incarnation + 1)
    assert ident.state.history == History(epoch=2, round=5, members=(dead_id, 7))
    ident.release(forget=True)


def test_an_agent_started_beside_a_frozen_one_gets_a_fresh_identity(tmp_path, holder):
    frozen_id, _ = _claimed(holder)
    os.kill(holder.pid, signal.SIGSTOP)  # frozen: alive, and may come back with its vote
    ident = Identity.claim(tmp_path, "job42")
    assert ident.node_id != frozen_id and ident.incarnation == 1 and ident.state == NodeState()
    ident.release(forget=True)


def test_a_graceful_end_leaves_nothing_to_take_over(tmp_path):
    first = Identity.claim(tmp_path, "job42")
    first.save(NodeState(History(epoch=1, round=1, members=(first.node_id,)), None))
    first.release(forget=True)
    assert [p.name for p in tmp_path.iterdir()] == [_identity.CLAIM_LOCK]  # its lock file went too
    second = Identity.claim(tmp_path, "job42")
    assert second.node_id != first.node_id and second.state == NodeState()
    second.release(forget=True)


def _died_ago(ident: Identity, seconds: float) -> None:
    """The slot's process died (its lock is free) ``seconds`` ago: nobody touched it since."""
    path = ident._path
    assert path is not None
    ident.release(forget=False)
    os.utime(path, (time.time() - seconds, time.time() - seconds))


def test_a_slot_whose_process_died_longer_ago_than_the_job_waits_starts_afresh(tmp_path):
    # The job's other agents waited join_timeout for it: they formed a round without it, or
    # gave up. A job started again under that rdzv_id must not begin from the dead job's round.
    recent, old = Identity.claim(tmp_path, "job42", keep_s=60), Identity.claim(tmp_path, "job42", keep_s=60)
    for ident in (recent, old):
        ident.save(NodeState(History(epoch=1, round=4, members=(recent.node_id, old.node_id)), None))
    _died_ago(recent, 30)
    _died_ago(old, 600)
    a, b = Identity.claim(tmp_path, "job42", keep_s=60), Identity.claim(tmp_path, "job42", keep_s=60)
    assert (a.node_id, a.incarnation) == (recent.node_id, 2) and a.state.history is not None
    assert b.node_id != old.node_id and b.incarnation == 1 and b.state == NodeState()
    for ident in (a, b):
        ident.release(forget=True)


def test_a_live_agent_touches_its_slot_so_a_long_run_without_a_vote_keeps_it(tmp_path, monkeypatch):
    ident = Identity.claim(tmp_path, "job42", keep_s=60)
    path = ident._path
    assert path is not None
    os.utime(path, (0, 0))
    ident.keep_alive()
    assert path.stat().st_mtime == 0  # touched at most every keep_s / 4
    monkeypatch.setattr(time, "monotonic", lambda: ident._touched + 16)
    ident.keep_alive()
    assert path.stat().st_mtime > time.time() - 5
    ident.release(forget=True)


def test_stale_slots_of_other_jobs_are_swept_and_live_or_recent_ones_are_not(tmp_path, holder):
    _claimed(holder)  # a live agent of job42
    gone = Identity.claim(tmp_path, "a job that crashed long ago", keep_s=60)
    recent = Identity.claim(tmp_path, "a job that crashed just now", keep_s=60)
    _died_ago(gone, 600)
    _died_ago(recent, 10)
    before = {p.name for p in tmp_path.iterdir()}
    ours = Identity.claim(tmp_path, "another job")
    after = {p.name for p in tmp_path.iterdir()}
    long_ago = _prefix("a job that crashed long ago")
    assert before - after == {f"{long_ago}.0", f"{long_ago}.0.b", f"{long_ago}.0.lock"}
    assert any(p.startswith(_prefix("job42")) for p in after)
    assert any(p.startswith(_prefix("a job that crashed just now")) for p in after)
    ours.release(forget=True)


def _prefix(job: str) -> str:
    return hashlib.sha256(job.encode()).hexdigest()[:16]


def test_a_lock_file_unlinked_by_its_holder_as_it_was_opened_is_no_lock(tmp_path, monkeypatch):
    """The holder's graceful end unlinks the lock file while another agent opened it: that
    agent's lock on the unlinked file would be a second owner of the slot (a third agent
    creates the file again and locks it)."""
    lock = tmp_path / "slot.lock"
    lock.write_text("")
    real = fcntl.flock

    def flock_after_the_holder_ended(fd: int, op: int) -> None:
        lock.unlink()  # the holder ended gracefully ...
        lock.write_text("")  # ... and a third agent made the slot again
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_ended)
    assert _identity._try_lock(lock) is None
    monkeypatch.setattr(fcntl, "flock", real)
    fd = _identity._try_lock(lock)
    assert fd is not None
    os.close(fd)


def test_nodes_of_one_process_and_of_other_jobs_take_slots_of_their_own(tmp_path):
    a, b = Identity.claim(tmp_path, "job42"), Identity.claim(tmp_path, "job42")
    other = Identity.claim(tmp_path, "another job")
    assert len({a.node_id, b.node_id, other.node_id}) == 3
    for ident in (a, b, other):
        ident.release(forget=True)


def test_without_a_usable_directory_a_node_runs_with_a_fresh_identity_and_says_so(tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    ident = Identity.claim(blocked / "state", "job42")
    assert ident.incarnation == 1
    assert "a restarted agent of this node will not get its vote back at once" in caplog.text


def test_the_sweep_deletes_only_slots_and_leaves_other_files_alone(tmp_path):
    """A state directory shared with other programs ($HOME, /tmp): old files and their lock
    files, and a file named as a slot that holds no slot's state, are not ours to delete."""
    names = {"notes", "notes.lock", "0123456789abcdef.0", "0123456789abcdef.0.lock"}
    long_ago = time.time() - 7200
    for name in names:
        (tmp_path / name).write_text("not a slot")
        os.utime(tmp_path / name, (long_ago, long_ago))
    ours = Identity.claim(tmp_path, "another job")
    assert names <= {p.name for p in tmp_path.iterdir()}
    ours.release(forget=True)


def test_a_vote_that_cannot_be_written_forsakes_the_slot_so_no_new_process_votes_with_older_state(
    tmp_path, monkeypatch
):
    ident = Identity.claim(tmp_path, "job42")
    assert ident.save(NodeState(History(epoch=1, round=1, members=(ident.node_id, 7)), None))

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "fdatasync", disk_full)
        vote = History(epoch=1, round=2, members=(ident.node_id, 7))
        assert ident.save(NodeState(ident.state.history, vote))  # forsaken: the vote may go out
    ident.release(forget=False)  # its process dies
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id != ident.node_id and after.state == NodeState()  # not round 1 without the vote
    after.release(forget=True)


def test_a_vote_that_can_neither_be_written_nor_forsaken_must_not_go_out(tmp_path, monkeypatch):
    ident = Identity.claim(tmp_path, "job42")

    def broken(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "fdatasync", broken)
        m.setattr(_identity, "_fsync_dir", broken)
        assert not ident.save(NodeState(None, History(epoch=1, round=1, members=(ident.node_id,))))
    ident.release(forget=True)


def test_a_claim_waits_for_another_claim_in_the_directory_but_not_for_ever(tmp_path, monkeypatch):
    """Claims (and their sweeps) take turns: a sweep locks other jobs' slots for a moment, and
    a claim then would take a busy slot for a live agent's. A claimant frozen mid-claim holds
    the turn: the others claim anyway after CLAIM_WAIT_S."""
    monkeypatch.setattr(_identity, "CLAIM_WAIT_S", 0.3)
    fd = os.open(tmp_path / _identity.CLAIM_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a claim under way, its process frozen
        started = time.monotonic()
        ident = Identity.claim(tmp_path, "job42")
        assert time.monotonic() - started >= 0.3  # it waited its turn ...
        assert ident._path is not None  # ... and then claimed a slot
        ident.release(forget=True)
    finally:
        os.close(fd)


def test_the_highest_epoch_a_node_led_goes_to_its_next_process(tmp_path):
    """A predecessor that led a term and proposed nothing left no round behind: its successor
    must still start its election above that term, whose frames may be out."""
    ident = Identity.claim(tmp_path, "job42")
    assert ident.save(NodeState(None, None, led=7))
    ident.release(forget=False)  # its process dies
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id == ident.node_id and after.state.led == 7
    after.release(forget=True)


def test_the_rounds_a_node_heard_of_go_to_its_next_process(tmp_path):
    """A new member is counted in its round without its vote: a new process of it must still
    know of the rounds it heard of before it joined, or it founds a job beside them (seed
    8025425, ``Ballot.remember``)."""
    ident = Identity.claim(tmp_path, "job42")
    heard = NOTHING_HEARD.with_keys((1, 0x498D, 2), (2, 0x77, 1))
    assert ident.save(NodeState(heard=heard))
    ident.release(forget=False)  # its process dies
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id == ident.node_id and after.state.heard == heard
    after.release(forget=True)


def test_a_node_that_left_comes_back_as_a_new_node(tmp_path):
    """Its leave took its vote away (the others formed the next round without it): a process
    that took over its slot, the host having lost power before the agent let it go, must not
    vote with it again (seed 8038304, ``Ballot.leave``)."""
    ident = Identity.claim(tmp_path, "job42")
    assert ident.save(NodeState(History(epoch=1, round=5, members=(ident.node_id, 7)), None, left=True))
    ident.release(forget=False)  # the host went down before the agent released the slot
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id != ident.node_id and after.incarnation == 1 and after.state == NodeState()
    after.release(forget=True)


def test_what_a_node_heard_of_goes_to_the_disk_when_it_changes():
    saved: list[NodeState] = []
    ballot = Ballot.of(None, saved.append)
    heard = NOTHING_HEARD.with_keys((1, 5, 1))
    ballot.remember(heard)
    assert saved[-1].heard == heard
    ballot.remember(heard)
    assert len(saved) == 1  # unchanged: no write


def _round(number: int, members: tuple[int, ...]) -> Round:
    ips = tuple(f"198.18.0.{m}" for m in members)
    return Round(number=number, epoch=1, members=members, store_ip=ips[0], store_port=4, ips=ips)


def test_an_accepted_round_heard_to_have_formed_is_the_last_round_before_the_next_vote():
    """A member cut off before its round's "formed" reached it keeps its vote for that round;
    once it hears that the round formed, the round is its last one, on the disk, and a vote for
    the next proposal does not replace the only record of it (seed 30071042, ``Ballot.settle``)."""
    saved: list[NodeState] = []
    three, four = History.of(_round(3, (1, 2, 3, 4, 5))), History.of(_round(4, (1, 2, 3, 4, 5)))
    ballot = Ballot(history=three, accepted=four, persist=saved.append)
    ballot.remember(NOTHING_HEARD.with_keys(three.key))  # not round 4: its vote stays a vote
    assert (ballot.history, ballot.accepted) == (three, four) and saved[-1].accepted == four
    assert ballot.accept(_round(5, (1, 2, 3)), 4, frozenset(), NOTHING_HEARD.with_keys(four.key))
    assert saved[-1].history == four and saved[-1].accepted == History.of(_round(5, (1, 2, 3)))
    # By ``remember`` too (a welcome said so while the node waited), and without a vote after.
    ballot = Ballot(history=three, accepted=four, persist=saved.append)
    ballot.remember(NOTHING_HEARD.with_keys(four.key))
    assert saved[-1].history == four and saved[-1].accepted is None


def _on_disk(ident: Identity) -> Callable[[NodeState], None]:
    def persist(state: NodeState) -> None:
        assert ident.save(state)

    return persist


def test_a_vote_another_term_replaced_is_kept_until_it_is_heard_formed(tmp_path):
    """A node that voted for round 2 and then for round 3 of another term (which covered it)
    keeps round 2, on the disk and across a restart, and takes it as its last round once it
    hears that it formed, as round 4 of that other term, built on it, asks for its vote (seed
    40003081, ``Ballot.earlier``)."""
    members = (1, 2, 3, 4, 5)
    one, two = History.of(_round(1, members)), _round(2, members)
    other = (3, 4, 5, 1, 2)  # node 3 leads epoch 2
    three = Round(number=3, epoch=2, members=other, store_ip="198.18.0.3", store_port=4)
    four = Round(number=4, epoch=2, members=other, store_ip="198.18.0.3", store_port=4)
    ident = Identity.claim(tmp_path, "job42")
    ballot = Ballot(history=one, persist=_on_disk(ident))
    assert ballot.accept(two, 1, frozenset())
    assert ballot.accept(three, 1, frozenset({History.of(two).key}))  # round 2's fate unknown
    assert ident.state.accepted == History.of(three) and ident.state.earlier == (History.of(two),)
    ident.release(forget=False)  # its process dies
    after = Identity.claim(tmp_path, "job42")
    assert after.state.earlier == (History.of(two),)
    ballot = Ballot.of(after.state, _on_disk(after))
    assert ballot.accept(four, 2, frozenset(), NOTHING_HEARD.with_keys(History.of(two).key))
    state = after.state
    assert state.history == History.of(two) and state.accepted == History.of(four)
    assert not state.earlier
    # Its own term's later proposal ends a vote (that leader forms none of the earlier one).
    ballot = Ballot(history=one, persist=lambda state: None)
    assert ballot.accept(two, 1, frozenset()) and ballot.accept(_round(3, members), 1, frozenset())
    assert ballot.earlier == ()
    after.release(forget=True)


def test_a_state_file_of_a_large_job_reads_back_whole(tmp_path):
    """At 65,536 members, with a history, a vote and every replaced vote it may keep, the state
    file is several MB: read back cut short, it would be garbage and the vote lost."""
    n = 65_536
    members = tuple(range(1, n + 1))
    rounds = [Round(number=k, epoch=k, members=members[k:] + members[:k], store_ip="198.18.0.1",
                    store_port=4) for k in range(1, 7)]  # fmt: skip
    history, accepted, *earlier = (History.of(r) for r in rounds)
    ident = Identity.claim(tmp_path, "job42")
    assert ident.save(NodeState(history, accepted, earlier=tuple(earlier[:MAX_EARLIER])))
    ident.release(forget=False)
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id == ident.node_id
    assert after.state.history == history and after.state.accepted == accepted
    assert after.state.earlier == tuple(earlier[:MAX_EARLIER])
    after.release(forget=True)


#: What ``/tmp`` or a Kubernetes emptyDir allows (anyone may write there).
SHARED = stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO


@pytest.mark.parametrize("plant", ["another_users", "another_users_link", "a_private_dir_they_made"])
def test_a_state_directory_another_local_user_could_write_is_refused_with_the_fix(tmp_path, plant):
    """Another user who created the directory first (``/tmp/torch_mingle-<uid>`` without
    ``$XDG_RUNTIME_DIR``) could plant a slot with another host's node id: one vote on two hosts."""
    planted = tmp_path / "torch_mingle-0"
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    if plant == "another_users_link":
        planted.symlink_to(real)
        os.lchown(planted, 65534, 65534)
    elif plant == "another_users":
        planted.mkdir()
        os.chmod(planted, SHARED)
        os.chown(planted, 65534, 65534)
    else:  # a shared directory (mode 0777), where they made "our" private one first
        planted.mkdir()
        os.chmod(planted, SHARED)
        ours = planted / f"torch_mingle-{os.geteuid()}"
        ours.mkdir()
        os.chmod(ours, SHARED)
        os.chown(ours, 65534, 65534)
    (real / "planted").write_text("a stranger's slot")
    with pytest.raises(MingleConfigError, match=r"state directory .*torch_mingle-0.* Fix: remove it"):
        Identity.claim(planted, "job42")


def test_in_a_directory_others_may_write_the_slots_go_to_a_private_one_inside(tmp_path):
    """``/tmp`` or a Kubernetes emptyDir (mode 0777): a directory of this user's, 0700, inside."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, SHARED)
    ident = Identity.claim(shared, "job42")
    inside = shared / f"torch_mingle-{os.geteuid()}"
    assert stat.S_IMODE(inside.stat().st_mode) == 0o700 and list(inside.glob("*.0"))
    again = (
        Identity.claim(tmp_path / "link", "job42") if (tmp_path / "link").symlink_to(shared) is None else None
    )
    assert again is not None and again.node_id != ident.node_id  # a link of ours is followed
    for held in (ident, again):
        held.release(forget=True)


def test_a_new_state_directory_is_private_and_a_planted_link_is_not_written_through(tmp_path):
    state = tmp_path / "new" / "state"
    ident = Identity.claim(state, "job42")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    slot = next(state.glob("*.0"))
    ident.release(forget=True)
    target = tmp_path / "victim"
    target.write_text("precious")
    for copy in (slot, slot.with_name(slot.name + ".b")):
        copy.symlink_to(target)  # (only this user could: the directory is private)
    planted = Identity.claim(state, "job42")
    assert target.read_text() == "precious"
    assert planted._path is None  # it goes on without a slot (and says so)
    planted.release(forget=True)


def _copies(tmp_path: Path) -> list[Path]:
    (slot,) = tmp_path.glob("*.0")
    return [slot, slot.with_name(slot.name + ".b")]


def _vote(ident: Identity, round_number: int) -> History:
    vote = History(epoch=1, round=round_number, members=(ident.node_id, 7))
    assert ident.save(NodeState(None, vote))
    return vote


def test_each_vote_goes_to_the_other_copy_and_the_next_process_reads_the_newer(tmp_path):
    ident = Identity.claim(tmp_path, "job42")
    for number in range(1, 5):
        last = _vote(ident, number)
    ident.release(forget=False)  # its process dies
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id == ident.node_id and after.state.accepted == last
    vote = _vote(after, 5)  # and it goes on writing in turn
    after.release(forget=False)
    again = Identity.claim(tmp_path, "job42")
    assert again.state.accepted == vote and again.incarnation == 3
    again.release(forget=True)


@pytest.mark.parametrize("cut", ["short", "torn", "empty"])
def test_a_write_that_a_power_loss_cut_short_leaves_the_vote_before_it(tmp_path, cut):
    """The copy being written when the host lost power: its first bytes only, or its new
    bytes over its old ones, or nothing. The other copy holds the vote before, which is what
    went out (the new one never did: its write had not returned)."""
    ident = Identity.claim(tmp_path, "job42")
    before = _vote(ident, 1)
    _vote(ident, 2)
    ident.release(forget=False)
    newest = max(_copies(tmp_path), key=lambda p: _identity._read_copy(p)[4])  # type: ignore[index]
    whole = newest.read_bytes()
    damaged = {"short": whole[: len(whole) // 2], "torn": whole[:-12] + b"0" * 12, "empty": b""}[cut]
    newest.write_bytes(damaged)
    after = Identity.claim(tmp_path, "job42")
    assert after.node_id == ident.node_id and after.state.accepted == before
    after.release(forget=True)
