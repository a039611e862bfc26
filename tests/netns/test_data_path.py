"""The data path, checked before training: one agent per namespace, and two of the hosts that
cannot reach each other by TCP although each reaches the leader (a wrong route, a firewall).

Without the check, such a job forms its round and its workers hang in the gloo rendezvous
(10 to 30 minutes in the field, until a timeout). With it, every node fails within seconds,
with an error that names the pair, the interface and what to do; and once the route is
fixed, the same hosts train.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import (
    Agent,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    logged_at,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)
from tests.netns.segment import nftables_available

pytestmark = pytest.mark.netns

FAIL_WITHIN_S = 10.0


def _blackhole(host, towards) -> None:
    subprocess.run(
        ["ip", "-n", host.name, "route", "add", "blackhole", f"{towards.ip}/32"], check=True, timeout=30
    )


def _unblackhole(host, towards) -> None:
    subprocess.run(
        ["ip", "-n", host.name, "route", "del", "blackhole", f"{towards.ip}/32"], check=True, timeout=30
    )


def _job(hosts, tmp_path, name: str) -> list[Agent]:
    """The leader's host starts first, so that the two others are followers."""
    cmd = torchrun_cmd(
        job=unique_job(name), nnodes=str(len(hosts)), nproc=1,
        conf={"interface": "eth0", "join_timeout": 60},
        script_args=["--steps", "3", "--report", str(tmp_path / name)],
    )  # fmt: skip
    leader = start_agent(f"{name}-{hosts[0].name}", cmd, tmp_path, netns=hosts[0].name)
    leads = lambda: "this node leads job" in leader.output()  # noqa: E731
    wait_until(leads, 60, "the first host to lead", agents=[leader])
    return [leader] + [start_agent(f"{name}-{h.name}", cmd, tmp_path, netns=h.name) for h in hosts[1:]]


def test_two_followers_that_cannot_reach_each_other_fail_the_job_fast_and_say_which(segment, tmp_path):
    hosts = [segment.add_host(f"198.18.0.{30 + i}") for i in range(3)]
    a, b = hosts[1], hosts[2]
    _blackhole(a, b)  # a's packets to b vanish: a's connect fails, b's gets no answer
    agents = _job(hosts, tmp_path, "blackhole")
    codes = finish_all(agents, timeout=90)
    ended = time.time()
    assert all(code != 0 for code in codes), dump(agents)
    formed = logged_at(agents[0], "round 1 formed")
    assert formed is not None, dump(agents)
    print(f"the round formed, then every agent failed {ended - formed:.2f}s later")
    assert ended - formed <= FAIL_WITHIN_S, dump(agents)
    # Each node names the pair, the interface and the fix; no worker trained.
    for agent in agents:
        out = agent.output()
        assert "data path check failed" in out, dump(agents)
        assert f"{a.ip} on interface eth0" in out or f"{b.ip} on interface eth0" in out, dump(agents)
        assert "ip route get" in out and "docs/networks.md" in out, dump(agents)
    assert f"rank 2 at {b.ip} port" in agents[1].output() or f"at {b.ip} port" in agents[1].output()
    assert f"at {a.ip} port" in agents[2].output(), dump(agents)
    assert not list((tmp_path / "blackhole").glob("first-*.json")), "a worker trained\n" + dump(agents)

    # The route fixed, the same hosts train.
    _unblackhole(a, b)
    agents = _job(hosts, tmp_path, "fixed")
    assert finish_all(agents, timeout=120) == [0, 0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "fixed"), 3, 3, agents)


# Run in the probing host's namespace; the probe's result goes to stdout.
_PROBE = textwrap.dedent("""
    import json, sys, time
    from torch_mingle._datapath import probe
    ip, port, timeout_s, retry_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    start = time.monotonic()
    failed, local = probe([(1, ip, port)], timeout_s, retry_s=retry_s)
    took = time.monotonic() - start
    print(json.dumps({"failed": [u.why for u in failed], "local": len(local), "took": took}))
""")
# Run in the peer's namespace: listens (never accepts) until its stdin closes.
_LISTEN = (
    "import socket, sys; s = socket.create_server(('0.0.0.0', 0)); "
    "print(s.getsockname()[1], flush=True); sys.stdin.read()"
)
LOST_SYNS, PROBE_TIMEOUT_S = 5, 4.5


def _lose_first_syns(host, port: str, count: int) -> None:
    """``host`` drops the first ``count`` connection requests to ``port`` (then every other
    ``count`` of each ``2 * count``): what random loss does to an unlucky probe, made exact."""
    rules = (
        "table inet mgl_syn {\n chain i { type filter hook input priority 0; "
        f"tcp dport {port} tcp flags & (syn | ack) == syn numgen inc mod {2 * count} < {count} drop; }}\n}}\n"
    )
    subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rules, text=True,
                   check=True, timeout=30)  # fmt: skip


def test_a_lossy_path_passes_the_check_because_unanswered_peers_get_more_connects(segment):
    """One connect sends its SYN about five times in 4.5 s (this kernel backs off linearly
    first), so losing the first five fails it; with one more connect each second, the sixth
    SYN goes out at 2 s. In the field: a lossy link, where a single connect failed about one
    probe in 160 at 20 % loss each way, and a job of 3 nodes one run in 30."""
    reason = nftables_available()
    if reason is not None:
        pytest.skip(reason)
    prober, peer = segment.add_host("198.18.0.41"), segment.add_host("198.18.0.42")
    listener = subprocess.Popen(
        ["ip", "netns", "exec", peer.name, sys.executable, "-c", _LISTEN],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None
        port = listener.stdout.readline().strip()
        results = {}
        for retry_s in (1.0, 100.0):  # 100: one connect and its own retransmits, as before
            subprocess.run(["ip", "netns", "exec", peer.name, "nft", "delete", "table", "inet", "mgl_syn"],
                           capture_output=True, check=False, timeout=30)  # fmt: skip
            _lose_first_syns(peer, port, LOST_SYNS)
            done = subprocess.run(
                ["ip", "netns", "exec", prober.name, sys.executable, "-c", _PROBE,
                 peer.ip, port, str(PROBE_TIMEOUT_S), str(retry_s)],
                check=False, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            results[retry_s] = json.loads(done.stdout)
        print(results)
        assert results[1.0]["failed"] == [] and results[1.0]["local"] == 0, results
        assert results[100.0]["failed"] == [f"no answer within {PROBE_TIMEOUT_S:g} s"], results
    finally:
        listener.kill()
        listener.wait(timeout=30)
