"""A node's identity across restarts of its agent (``_identity``): a dead agent's slot, id and
vote go to the next agent on its host; a frozen agent's never do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from torch_mingle._identity import Identity
from torch_mingle._node import NodeState
from torch_mingle._rounds import History

HOLDER = """
import sys, time
from pathlib import Path
from torch_mingle._identity import Identity
from torch_mingle._node import NodeState
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
    second = Identity.claim(tmp_path, "job42")
    assert second.node_id != first.node_id and second.state == NodeState()
    second.release(forget=True)


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
