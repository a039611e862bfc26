"""Heartbeats over a lossy link: the longest silence TCP puts between two heartbeats.

Two hosts (network namespaces on one bridge) keep one TCP connection, as a node and its leader
do, and each sends a small frame every ``--interval`` seconds (0.2 s, the default heartbeat),
with Linux's default retransmission timeouts, with linear timeouts alone, and with the options
of mingle's control connections (``_loop.tune_control_socket``). nftables drops ``--loss`` %
(20) of the packets on one host's link, both ways. Each side records the gaps between the
heartbeats it reads: the longest is what the heartbeat timeout (0.2 s x 7 = 1.4 s) must
outlast, and a gap past the timeout less one interval (1.2 s) leaves no room for anything else
(a stalled agent).

    .venv/bin/python benchmarks/lossy_heartbeats.py [--seconds 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.netns.segment import Host, Segment, netns_available, nftables_available

PORT = 29600
TIMEOUT_S, TOLERANCE_S = 1.4, 1.2
#: The sockets compared: Linux's defaults, linear timeouts alone, and mingle's control connection.
MODES = {
    "default": "Linux defaults",
    "thin": "linear timeouts",
    "mingle": "mingle (linear, RTO 20 ms-1 s)",
}

#: One side of the connection, run inside a namespace: beat every INTERVAL, read the other side's
#: beats, print the gaps between them as JSON at the end. argv: role ip interval seconds mode root
SIDE = r"""
import json, selectors, socket, sys, time
sys.path.insert(0, sys.argv[6])
from torch_mingle._loop import TCP_THIN_LINEAR_TIMEOUTS, tune_control_socket
role, ip, interval, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
mode = sys.argv[5]
if role == "server":
    lst = socket.create_server((ip, %(port)d)); sock, _ = lst.accept()
else:
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection((ip, %(port)d), timeout=1); break
        except OSError:
            if time.monotonic() > deadline: raise
            time.sleep(0.05)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if mode == "thin":
    sock.setsockopt(socket.IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, 1)
elif mode == "mingle":
    tune_control_socket(sock)
sock.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(sock, selectors.EVENT_READ)
start = time.monotonic(); end = start + seconds; next_beat = start; last = None; gaps = []
while (now := time.monotonic()) < end:
    if now >= next_beat:
        sock.send(b"\x00\x00\x00\x0a{\"t\":\"hb\"}")
        next_beat += interval
    for _ in sel.select(max(0.0, min(next_beat, end) - time.monotonic())):
        data = sock.recv(65536)
        if not data:
            end = 0
            break
        now = time.monotonic()
        if last is not None:
            gaps.append(now - last)
        last = now
print(json.dumps(gaps))
"""


def run(hosts: list[Host], interval: float, seconds: float, mode: str, root: str) -> list[float]:
    code = SIDE % {"port": PORT}
    args = [str(interval), str(seconds), mode, root]
    server = subprocess.Popen(
        ["ip", "netns", "exec", hosts[0].name, sys.executable, "-c", code, "server", hosts[0].ip, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    client = subprocess.Popen(
        ["ip", "netns", "exec", hosts[1].name, sys.executable, "-c", code, "client", hosts[0].ip, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        outs = [p.communicate(timeout=seconds + 60)[0] for p in (server, client)]
    finally:
        for p in (server, client):
            if p.poll() is None:
                p.kill()
                p.wait()
    return [gap for out in outs for gap in json.loads(out)]


def summary(gaps: list[float]) -> dict[str, float | int]:
    ordered = sorted(gaps)
    return {
        "beats": len(gaps),
        "median_s": ordered[len(ordered) // 2],
        "p999_s": ordered[min(len(ordered) - 1, int(len(ordered) * 0.999))],
        "max_s": ordered[-1],
        "over_tolerance": sum(1 for g in gaps if g > TOLERANCE_S),
        "over_timeout": sum(1 for g in gaps if g > TIMEOUT_S),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--loss", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    reason = netns_available() or nftables_available()
    if reason is not None:
        print(f"needs network namespaces and nftables: {reason}")
        return 2
    root = str(Path(__file__).resolve().parent.parent)
    segment = Segment()
    results = {}
    try:
        segment.create_bridge("br0")
        hosts = [segment.add_host(f"198.18.0.{31 + i}") for i in range(2)]
        segment.loss(hosts[1], args.loss, link="eth0")
        for mode, name in MODES.items():
            results[name] = summary(run(hosts, args.interval, args.seconds, mode, root))
    finally:
        segment.destroy()
    print(
        f"heartbeats every {args.interval:g}s both ways, {args.loss}% loss on one link both ways, "
        f"{args.seconds:g}s per row"
    )
    print(
        f"{'retransmission timeouts':<30} "
        + " ".join(f"{h:>7}" for h in ("beats", "median", "p99.9", "max", ">1.2s", ">1.4s"))
    )
    for name, r in results.items():
        print(
            f"{name:<30} {r['beats']:>7} {r['median_s']:>6.3f}s {r['p999_s']:>6.3f}s {r['max_s']:>6.3f}s "
            f"{r['over_tolerance']:>7} {r['over_timeout']:>7}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
