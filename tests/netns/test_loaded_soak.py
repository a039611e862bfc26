"""A one-minute smoke of the loaded soak (``make soak`` runs it for 30 minutes): with the
default heartbeats, a loaded job whose agents stall for 1 s and whose links lose 20 % of their
packets trains to its end in its first round; a stall longer than the bound breaks the round,
and the soak counts it (the count can fail)."""

from __future__ import annotations

import pytest

from tests.stress.loaded_soak import NODES, run

pytestmark = pytest.mark.netns


@pytest.mark.timeout(420)
def test_a_loaded_job_with_stalls_and_loss_trains_in_its_first_round(tmp_path):
    result = run(60.0, 1.0, tmp_path, stalls=8, clock_step_s=0.0)  # the CI machine's clock stays
    assert result["ok"], result
    assert result["false_alarms"] == 0 and not result["lost_heartbeat_lines"], result
    held = result["stalls_held_s"]
    assert len(held) >= 4 and all(h >= 0.99 for h in held), held  # the stalls really held the GIL
    assert [e for _, e in result["events"] if e.startswith("loss: 20%")], result["events"]
    assert result["world"] == [NODES]


@pytest.mark.timeout(420)
def test_a_stall_longer_than_the_bound_is_a_freeze_and_the_soak_counts_the_broken_round(tmp_path):
    result = run(30.0, 3.0, tmp_path, stalls=1, loss=False, clock_step_s=0.0)
    assert not result["ok"], result
    assert result["false_alarms"] >= 1, result
    silent = ("no heartbeat",)  # its session's clock: the one owner of a leader's silence
    assert any(s in line for line in result["lost_heartbeat_lines"] for s in silent), result
