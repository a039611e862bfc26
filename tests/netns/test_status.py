"""``torch-mingle status`` against a live job, one torchrun agent per network namespace: it
follows the job through a spare, a frozen member that comes back and is held back by
``rejoin_delay``, and a kill, plain and with a secret. The text it printed at each step is
kept in the test's output (docs/usage.md#a-live-view-torch-mingle-status shows one)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import ROOT, Agent, agent_env, dump, leader_of, start_training, wait_until

pytestmark = pytest.mark.netns


def _status(host: Any, job: str, secret: str | None, *, text: bool = False) -> Any:
    cmd = ["ip", "netns", "exec", host.name, sys.executable, "-m", "torch_mingle", "status", job,
           "--interface", "eth0", "--seconds", "1"]  # fmt: skip
    if secret is not None:
        cmd += ["--secret-file", secret]
    if not text:
        cmd.append("--json")
    done = subprocess.run(
        cmd, cwd=ROOT, env=agent_env(), capture_output=True, text=True, timeout=60, check=False
    )
    if text:
        return done.stdout
    return json.loads(done.stdout) if done.returncode == 0 else None


def _seen(view: Any, agent: Agent, where: str) -> bool:
    return view is not None and agent.node_id() in {m["node"] for m in view[where]}


@pytest.mark.parametrize("with_secret", [False, True])
def test_status_follows_a_job_through_a_spare_a_held_back_node_and_a_kill(segment, tmp_path, with_secret):
    hosts = [segment.add_host(f"198.18.0.{40 + i}") for i in range(4)]
    conf: dict[str, Any] = {"rejoin_delay": 120}
    secret = None
    if with_secret:
        path = tmp_path / "secret"
        path.write_text("a-secret-for-the-status-netns-test-0123456789")
        path.chmod(0o600)
        conf["secret_file"] = secret = str(path)
    agents = start_training(hosts, tmp_path, conf, nnodes="2:3", steps=600, step_time=0.1, prefix="status")
    job, cli = agents[0].job, hosts[0]
    frozen = None
    shown = []
    try:
        views: list[Any] = []

        def look(ok: Any) -> bool:
            views.append(_status(cli, job, secret))
            return views[-1] is not None and bool(ok(views[-1]))

        wait_until(
            lambda: look(lambda v: len(v["members"]) == 3 and len(v["spares"]) == 1), 60, "3 + a spare"
        )
        shown.append(_status(cli, job, secret, text=True))
        leader = leader_of(agents)
        spare = next(a for a in agents if _seen(views[-1], a, "spares"))
        frozen, victim = (a for a in agents if a not in (leader, spare))
        frozen.kill(signal.SIGSTOP)  # silent past the heartbeat bound: dropped, the spare takes its rank
        wait_until(
            lambda: look(lambda v: _seen(v, spare, "members") and v["state"] == "running"), 60, "round 2"
        )
        frozen.kill(signal.SIGCONT)  # back while round 2 runs: held back by rejoin_delay
        wait_until(lambda: look(lambda v: _seen(v, frozen, "held")), 60, "the returned node held back")
        shown.append(_status(cli, job, secret, text=True))
        assert any(f"node {frozen.node_id()} lost" in s["what"] for s in views[-1]["story"]), views[-1]
        victim.kill()
        wait_until(
            lambda: look(lambda v: any(f"node {victim.node_id()} lost" in s["what"] for s in v["story"])),
            60,
            "the kill in the story",
        )
        shown.append(_status(cli, job, secret, text=True))
        print("\n\n".join(shown))
    except AssertionError:
        raise AssertionError(dump(agents)) from None
    finally:
        if frozen is not None:
            frozen.kill(signal.SIGCONT)
        for agent in agents:
            agent.kill()
