"""What a Slurm job says (``_slurm``): its id as the rendezvous id, its node list as standby peers."""

from __future__ import annotations

import pytest

from torch_mingle import _slurm
from torch_mingle.config import MingleConfig
from torch_mingle.errors import MingleConfigError

SRUN = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[1-2,10],cpu01", "SLURM_STEP_NODELIST": "gpu[1-2]"}


def test_torchruns_default_id_becomes_the_slurm_jobs_id():
    assert _slurm.run_id("none", SRUN) == "4242"
    assert _slurm.run_id("job42", SRUN) == "job42"  # an id given wins
    assert _slurm.run_id("none", {}) == "none"  # outside Slurm nothing changes


def test_the_steps_node_list_is_expanded_by_hostlist():
    assert _slurm.standby_hosts(SRUN) == ("gpu1", "gpu2")
    job_only = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_NODELIST"}
    assert _slurm.standby_hosts(job_only) == ("gpu1", "gpu2", "gpu10", "cpu01")
    assert _slurm.standby_hosts({}) == ()


def test_a_bad_node_list_names_the_variable_and_the_fix():
    with pytest.raises(MingleConfigError, match=r"\$SLURM_STEP_NODELIST='gpu\[1-' is not a Slurm host list"):
        _slurm.standby_hosts({"SLURM_STEP_NODELIST": "gpu[1-"})


def test_a_node_list_too_long_to_reach_one_by_one_is_not_used():
    assert _slurm.standby_hosts({"SLURM_JOB_NODELIST": "n[1-5000]"}) == ()


def test_peers_given_by_the_user_win_over_the_node_list():
    cfg = MingleConfig.from_mapping(run_id="j", min_nodes=1, max_nodes=1, conf={})
    assert cfg.standby_hosts(SRUN) == ("gpu1", "gpu2")
    assert cfg.standby_hosts({**SRUN, "TORCH_MINGLE_PEERS": "a,b"}) == ()
    given = MingleConfig.from_mapping(run_id="j", min_nodes=1, max_nodes=1, conf={"peers": "a;b"})
    assert given.standby_hosts(SRUN) == ()
