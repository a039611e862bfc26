"""A hostile sender for tests: floods a job's multicast group with garbage and forged datagrams.

It joins the group first and records what the real nodes send, so that besides random bytes,
truncated and bit-flipped datagrams, and forgeries (the job's label, random senders, no tag or
a wrong tag), it also replays genuine datagrams. It sends from one process at ``--rate``
datagrams per second for ``--seconds`` and prints one JSON line with what it achieved.

    python -m tests.flood --iface 127.0.0.1 --group 239.255.77.77 --port 30001 --job j1

``Flood`` starts it from a test or a benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time

from tests.helpers import ROOT
from torch_mingle._wire import Announce, Codec, Datagram, Query

BATCH = 200


class Flood:
    """This module in a process of its own, sending from 127.0.0.1 for ``seconds``, then stopping.

    It has started flooding (after ``capture`` seconds of listening) when the constructor returns.
    """

    def __init__(
        self,
        group: str,
        port: int,
        job: str,
        *,
        seconds: float,
        rate: int = 25_000,
        garbage_only: bool = False,
        capture: float = 0.0,
    ) -> None:
        args = [sys.executable, "-m", "tests.flood", "--iface", "127.0.0.1", "--group", group,
                "--port", str(port), "--job", job, "--rate", str(rate), "--seconds", str(seconds),
                "--capture", str(capture)]  # fmt: skip
        if garbage_only:
            args.append("--garbage-only")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "flooding":
            self.proc.kill()
            raise RuntimeError("the flood did not start")

    def result(self) -> dict[str, float]:
        """Waits for the flood to end by itself; what it sent (``rate``, ``replays``, ...)."""
        out, _ = self.proc.communicate(timeout=60)
        report: dict[str, float] = json.loads(out.strip().splitlines()[-1])
        return report


def forged(job: str, rng: random.Random) -> list[bytes]:
    """Well-formed datagrams of ``job`` that no real node sent: unsigned and wrongly signed.

    Forged announcements point at 127.0.0.2, where nothing listens: a node fooled by one (a
    job without a secret) is refused at once and never connects outside this machine.
    """
    out = []
    for key in (None, os.urandom(32)):
        codec = Codec(key)
        for _ in range(50):
            sender = rng.getrandbits(64) or 1
            body = (
                Query(epoch_seen=rng.randrange(1, 1000))
                if rng.random() < 0.5
                else Announce(
                    epoch=rng.randrange(1, 1000),
                    store_ip="127.0.0.2",
                    store_port=rng.randrange(1, 65535),
                )
            )
            dgram = Datagram(
                job=job, sender=sender, body=body, sent_ms=int(time.time() * 1000), nonce=rng.getrandbits(64)
            )
            out.append(codec.encode(dgram))
    return out


def garbage(samples: list[bytes], rng: random.Random, *, flips: bool) -> list[bytes]:
    """Invalid datagrams: random bytes, our magic and noise, truncations, and (``flips``) bit flips.

    A bit flip in an unsigned datagram may leave it well-formed, so ``flips`` is off when
    the flood must be garbage only.
    """
    out = [os.urandom(rng.randrange(0, 1500)) for _ in range(100)]
    out += [b"MNGL" + os.urandom(rng.randrange(0, 200)) for _ in range(50)]
    for data in samples:
        out.append(data[: rng.randrange(0, len(data))])
        if flips:
            flipped = bytearray(data)
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            out.append(bytes(flipped))
    return out


def capture(iface: str, group: str, port: int, seconds: float) -> list[bytes]:
    """Genuine datagrams of whatever runs on the group now, to replay later."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", port))  # noqa: S104 - a multicast receiver binds the wildcard; the group is joined on iface only
    sock.setsockopt(
        socket.IPPROTO_IP,
        socket.IP_ADD_MEMBERSHIP,
        struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(iface)),
    )
    sock.settimeout(0.05)
    seen: list[bytes] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(seen) < 500:
        try:
            seen.append(sock.recv(2048))
        except TimeoutError:
            continue
    sock.close()
    return seen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--iface", required=True, help="IPv4 address of the interface to send on (127.0.0.1 in tests)"
    )
    p.add_argument("--group", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--rate", type=int, default=25_000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--capture", type=float, default=0.0, help="seconds to listen first, for replays")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--garbage-only", action="store_true", help="no well-formed forgeries, only invalid bytes")
    args = p.parse_args()
    rng = random.Random(args.seed)
    replays = capture(args.iface, args.group, args.port, args.capture) if args.capture else []
    fake = forged(args.job, rng)
    pool = garbage(fake + replays, rng, flips=not args.garbage_only)
    if not args.garbage_only:
        pool += fake + replays * 20
    rng.shuffle(pool)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(args.iface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    sock.setblocking(False)
    dest = (args.group, args.port)
    print("flooding", flush=True)
    sent = dropped = 0
    start = time.monotonic()
    end = start + args.seconds
    i = 0
    while (now := time.monotonic()) < end:
        due = int((now - start) * args.rate)
        if sent + dropped >= due:
            time.sleep(BATCH / args.rate / 4)
            continue
        for _ in range(min(BATCH, due - sent - dropped)):
            try:
                sock.sendto(pool[i % len(pool)], dest)
                sent += 1
            except (BlockingIOError, OSError):
                dropped += 1
            i += 1
    took = time.monotonic() - start
    print(json.dumps({"sent": sent, "send_errors": dropped, "seconds": took, "rate": sent / took,
                      "replays": len(replays)}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
