"""``python -m torch_mingle ls|doctor`` against real torchrun agents on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.helpers import (
    ROOT,
    finish_all,
    random_port,
    rendezvous_all,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)

pytestmark = pytest.mark.integration


def mingle(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch_mingle", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def test_ls_and_doctor_see_a_running_job(tmp_path):
    job, port = unique_job("visible"), random_port()
    cmd = torchrun_cmd(
        job=job, nnodes="2", nproc=1, conf={"interface": "127.0.0.1", "port": port},
        script_args=["--steps", "200", "--step-time", "0.1", "--quiet"],
    )  # fmt: skip
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(2)]
    try:
        wait_until(lambda: all("joined round " in a.output() for a in agents), 120, "a round", agents=agents)
        where = ["--interface", "127.0.0.1", "--port", str(port)]
        listing = mingle("ls", *where, "--json")
        assert listing.returncode == 0, listing.stderr
        (seen,) = [j for j in json.loads(listing.stdout) if j["job"] == job]
        assert seen["leader_ip"] == "127.0.0.1"
        assert (seen["members"], seen["round"], seen["epoch"]) == (2, 1, 1)
        assert (seen["min_nodes"], seen["max_nodes"], seen["closed"]) == (2, 2, False)
        table = mingle("ls", *where)
        assert any(job in line and "running" in line for line in table.stdout.splitlines()), table.stdout
        doctor = mingle("doctor", *where, "--seconds", "1")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "lo: joined the group" in doctor.stdout
        assert f"job '{job}': leader 127.0.0.1, epoch 1, round 1, 2 node(s)" in doctor.stdout
    finally:
        for agent in agents:
            agent.kill()
        finish_all(agents, timeout=30)


def test_two_doctors_hear_each_other_on_loopback():
    args = ["doctor", "--interface", "127.0.0.1", "--port", str(random_port()), "--job", unique_job("doc"),
            "--seconds", "2"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch_mingle", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "OK: multicast reaches 1 other node(s) on lo" in out


def test_check_gpu_skips_a_machine_without_a_gpu_and_says_so():
    import torch

    done = mingle("check-gpu")
    if torch.cuda.is_available():  # on a GPU machine it checks for real
        assert done.returncode == 0 and "GPU(s) compute; NCCL" in done.stdout, done.stdout + done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "check-gpu: no CUDA device on this machine; nothing to check (skipped)"


def test_help_is_plain_text_with_a_line_per_command():
    out = mingle("--help").stdout
    assert "``" not in out and "This module" not in out, out
    for name in ("doctor", "ls", "check-gpu"):
        assert len([ln for ln in out.splitlines() if ln.strip().startswith(name)]) == 1, out
        sub = mingle(name, "--help").stdout
        assert sub.count("\n\n") >= 2, sub  # usage, a description, the options


def test_ls_and_doctor_on_a_job_with_a_secret_say_to_pass_it_and_the_job_logs_nothing(
    make_handler, port, tmp_path, caplog
):
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-the-cli-test-0123456789")
    secret.chmod(0o600)
    job = unique_job("secret-ls")
    handlers = [make_handler(job, 2, secret_file=str(secret)) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="torch_mingle"):
        rendezvous_all(handlers)
        where = ["--interface", "127.0.0.1", "--port", str(port)]
        blind = mingle("ls", *where)
        assert "none answered" in blind.stdout, blind.stdout
        assert (
            "hint: signed datagrams arrived: a job here uses a secret; pass its --secret-file" in blind.stdout
        )
        seeing = mingle("ls", *where, "--secret-file", str(secret), "--json")
        assert [j["job"] for j in json.loads(seeing.stdout)] == [job], seeing.stdout
        doctor = mingle("doctor", *where, "--seconds", "1", "--job", "probe")
        assert "hint: signed datagrams arrived" in doctor.stdout, doctor.stdout
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert not [w for w in warned if "dropped an invalid datagram" in w], warned


@pytest.mark.parametrize("with_secret", [False, True])
def test_status_shows_the_members_ranks_and_a_spare(make_handler, port, tmp_path, with_secret):
    conf = {}
    if with_secret:
        secret = tmp_path / "secret"
        secret.write_text("a-secret-for-the-status-test-0123456789")
        secret.chmod(0o600)
        conf["secret_file"] = str(secret)
    job = unique_job("status")
    members = [make_handler(job, 2, 2, **conf) for _ in range(2)]
    infos = rendezvous_all(members)
    spare = make_handler(job, 2, 2, join_timeout="30", **conf)

    def wait_as_a_spare() -> None:
        # It waits until the job ends, and then exits 0 as a spare of a finished job does.
        with contextlib.suppress(Exception, SystemExit):
            spare.next_rendezvous()

    threading.Thread(target=wait_as_a_spare, daemon=True).start()
    where = ["--interface", "127.0.0.1", "--port", str(port)]
    if with_secret:
        blind = mingle("status", job, *where)
        assert blind.returncode == 1 and "pass its --secret-file" in blind.stderr, blind.stderr
        where += ["--secret-file", conf["secret_file"]]
    views: list[dict[str, Any]] = []

    def spare_shown() -> bool:
        shown = mingle("status", job, *where, "--json")
        assert shown.returncode == 0, shown.stderr
        views.append(json.loads(shown.stdout))
        return bool(views[-1]["spares"])

    wait_until(spare_shown, 20, "the spare in the leader's view", interval=0.1)
    view = views[-1]
    ids = {h.diagnostics().node_id: i.rank for h, i in zip(members, infos, strict=True)}
    assert {m["node"]: m["rank"] for m in view["members"]} == ids
    assert view["state"] == "running" and view["round"] == 1 and view["world_size"] == 2
    assert [s["node"] for s in view["spares"]] == [spare.diagnostics().node_id], view
    text = mingle("status", job, *where).stdout
    assert f"job {job}: running" in text and "waits for a place" in text, text
