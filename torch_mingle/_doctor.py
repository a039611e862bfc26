"""What ``torch-mingle doctor`` and ``torch-mingle ls`` do; ``cli`` parses their arguments."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import selectors
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

from torch_mingle._claims import Dest, announced_store_ip
from torch_mingle._interfaces import Interface, discovery_interfaces, family_of, list_interfaces
from torch_mingle._record import field, record
from torch_mingle._transport import McastTransport
from torch_mingle._wire import PROBE_JOB, Announce, Codec, Datagram, Invalid, Probe, Query, derive_key
from torch_mingle.config import DEFAULT_GROUP_V4, DEFAULT_PORT, MingleConfig
from torch_mingle.errors import README_NETWORKS, MingleConfigError, MingleNetworkError

ASK_EVERY_S = 0.5
#: A reverse lookup slower than this is a resolver that store connects wait for (above the
#: 1 s that ``options timeout:1`` leaves).
RESOLVER_SLOW_S = 1.5


@record(frozen=False)
class JobSeen:
    job: str
    leader_ip: str = ""
    epoch: int = 0
    round: int = 0
    members: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    closed: bool = False
    nodes_asking: set[int] = field(default_factory=set)
    #: The leader's node id and control port (``torch-mingle status`` connects to it).
    leader: int = 0
    control_port: int = 0


@record(frozen=False)
class Heard:
    """Everything one listening session collected."""

    jobs: dict[str, JobSeen] = field(default_factory=dict)
    doctors: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (iface, path) -> peer IPs
    invalid: Counter[str] = field(default_factory=Counter)
    received: int = 0


def _transports(args: argparse.Namespace, *, broadcast: bool) -> list[McastTransport]:
    family = family_of(args.group)
    ifaces, _ = discovery_interfaces(args.interface, family)
    out = []
    for iface in ifaces:
        out.append(McastTransport(iface, args.group, args.port, broadcast=broadcast).open())
    return out


def _codec(args: argparse.Namespace) -> Codec:
    cfg = MingleConfig.from_mapping(
        run_id="cli",
        min_nodes=1,
        max_nodes=1,
        conf={"secret_file": args.secret_file} if args.secret_file else {},
    )
    secret = cfg.load_secret()
    return Codec(derive_key(secret) if secret is not None else None)


def _listen(
    transports: list[McastTransport],
    codec: Codec,
    seconds: float,
    *,
    me: int,
    doctor_job: str | None,
    probe: bool,
) -> Heard:
    heard = Heard()
    end = time.monotonic() + seconds
    next_ask = 0.0
    # selectors (epoll): select() fails on descriptor numbers of 1024 and more.
    with selectors.DefaultSelector() as sel:
        for t in transports:
            for sock in t.sockets():
                sel.register(sock, selectors.EVENT_READ, t)
        while (now := time.monotonic()) < end:
            if now >= next_ask:
                next_ask = now + ASK_EVERY_S
                for t in transports:
                    _ask(t, codec, me, doctor_job=doctor_job, probe=probe)
            for key, _ in sel.select(max(0.0, min(next_ask, end) - time.monotonic())):
                t = key.data
                for data, addr in t.receive([key.fileobj]):
                    heard.received += 1
                    decoded = codec.decode(data, wall_ms=int(time.time() * 1000))
                    _note(heard, decoded, addr, t.iface, me, doctor_job)
    return heard


def _ask(t: McastTransport, codec: Codec, me: int, *, doctor_job: str | None, probe: bool) -> None:
    """A probe for every leader, and the doctor's question, by multicast and by broadcast.

    The doctor's question carries its path in its label, so the answer says which got through.
    """

    def dgram(job: str, body: Query | Probe) -> bytes:
        return codec.encode(
            Datagram(job=job, sender=me, body=body, sent_ms=int(time.time() * 1000), nonce=_nonce())
        )

    if probe:
        t.send(dgram(PROBE_JOB, Probe()), (t.group, t.port))
    if doctor_job is not None:
        t.send(dgram(f"doctor/{doctor_job}/m", Query(0)), (t.group, t.port))
        if t.broadcast_addr is not None:
            t.send(dgram(f"doctor/{doctor_job}/b", Query(0)), (t.broadcast_addr, t.port))


def _nonce() -> int:
    return random.getrandbits(64)


def _note(
    heard: Heard, dgram: Datagram | Invalid, addr: Dest, iface: Interface, me: int, job: str | None
) -> None:
    if isinstance(dgram, Invalid):
        heard.invalid[dgram.reason] += 1
        return
    if dgram.sender == me:
        return
    ip = str(addr[0]) if addr else "?"
    if job is not None and dgram.job in (f"doctor/{job}/m", f"doctor/{job}/b"):
        path = "multicast" if dgram.job.endswith("/m") else "broadcast"
        heard.doctors.setdefault((iface.name, path), set()).add(ip)
        return
    if dgram.job.startswith("doctor/") or dgram.job == PROBE_JOB:
        return
    seen = heard.jobs.setdefault(dgram.job, JobSeen(job=dgram.job))
    body = dgram.body
    if isinstance(body, Announce):
        leader_ip = announced_store_ip(body, addr)
        seen.leader_ip, seen.epoch, seen.round, seen.members = leader_ip, body.epoch, body.round, body.members
        seen.min_nodes, seen.max_nodes, seen.closed = body.min_nodes, body.max_nodes, body.closed
        seen.leader, seen.control_port = dgram.sender, body.store_port
    elif isinstance(body, Query):
        seen.nodes_asking.add(dgram.sender)


# ----------------------------------------------------------------------------------- ls


def cmd_ls(args: argparse.Namespace) -> int:
    transports = _transports(args, broadcast=False)
    try:
        heard = _listen(transports, _codec(args), args.seconds, me=_nonce() or 1, doctor_job=None, probe=True)
    finally:
        for t in transports:
            t.close()
    jobs = sorted(heard.jobs.values(), key=lambda j: j.job)
    if args.json:
        print(json.dumps([{**j.__dict__, "nodes_asking": len(j.nodes_asking)} for j in jobs], indent=2))
        return 0
    where = ", ".join(t.iface.name for t in transports)
    print(f"rendezvous jobs on {where}, group {args.group} port {args.port} ({args.seconds:g}s):")
    if not jobs:
        print("  none answered")
    else:
        print(f"  {'JOB':<24} {'LEADER':<22} {'NODES':>7} {'MIN:MAX':>9} {'ROUND':>6} {'EPOCH':>6}  STATE")
        for j in jobs:
            state = (
                "closed"
                if j.closed
                else ("running" if j.round else ("forming" if j.leader_ip else "electing"))
            )
            nodes = str(j.members) if j.leader_ip else f"{len(j.nodes_asking)}?"
            print(
                f"  {j.job:<24} {j.leader_ip or '-':<22} {nodes:>7} {f'{j.min_nodes}:{j.max_nodes}':>9} "
                f"{j.round:>6} {j.epoch:>6}  {state}"
            )
    if heard.invalid:
        print(f"dropped datagrams: {dict(heard.invalid)}")
    for hint in _secret_hints(heard.invalid, signing=args.secret_file is not None):
        print(f"hint: {hint}")
    return 0


# ------------------------------------------------------------------------------- doctor


class ReverseLookups:
    """The lookup torch's TCPStore client makes before every connect, ``LOOKUPS`` at once, each
    in a thread of its own: the name of the store's address, as the IPv4-mapped IPv6 address it
    connects to (``::ffff:10.0.0.1``), which /etc/hosts does not hold. A resolver that drops
    queries makes store connects wait its timeout (mingle's, c10d's and the workers'): every
    one if it drops them all, some if it drops some (one query alone could not tell them
    apart). Either is a warning, not a problem: the job still forms, more slowly."""

    LOOKUPS = 3

    def __init__(self, address: str) -> None:
        self.address = address if ":" in address else f"::ffff:{address}"
        self._started = time.monotonic()
        self._took: list[float] = []
        self._answered = threading.Condition()
        for _ in range(self.LOOKUPS):
            threading.Thread(target=self._run, name="mingle-doctor-resolver", daemon=True).start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # an error is an answer: the connect goes on at once
            socket.getnameinfo((self.address, 0), 0)
        with self._answered:
            self._took.append(time.monotonic() - self._started)
            self._answered.notify_all()

    def report(self) -> str:
        """What to print, once every lookup answered or had its time."""
        with self._answered:
            self._answered.wait_for(
                lambda: len(self._took) == self.LOOKUPS,
                max(0.0, self._started + RESOLVER_SLOW_S - time.monotonic()),
            )
            quick = [t for t in self._took if t < RESOLVER_SLOW_S]
        if len(quick) == self.LOOKUPS:
            return (
                f"resolver: the slowest of {self.LOOKUPS} reverse lookups of {self.address} took "
                f"{max(quick) * 1000:.0f} ms"
            )
        return (
            "WARNING: "
            f"{self.LOOKUPS - len(quick)} of {self.LOOKUPS} reverse lookups of {self.address} had no "
            f"answer within {RESOLVER_SLOW_S:g}s: torch's store client makes one before every connect "
            "(mingle's round stores, c10d's, the workers' process groups), and each such connect "
            "waits for the resolver. Fix the DNS server in /etc/resolv.conf, or shorten its wait there "
            f"(options timeout:1 attempts:1); see {README_NETWORKS}"
        )


def cmd_doctor(args: argparse.Namespace) -> int:
    family = family_of(args.group)
    fam = "IPv6" if family == socket.AF_INET6 else "IPv4"
    print(f"torch_mingle doctor: group {args.group} port {args.port}, TTL 1, {fam}")
    print("interfaces:")
    for i in list_interfaces(family):
        print(f"  {i.name:<10} {', '.join(i.addresses) or '-':<32} {' '.join(i.flags())}")
    try:
        transports = _transports(args, broadcast=family == socket.AF_INET)
    except (MingleNetworkError, MingleConfigError) as exc:
        print(f"FAIL: {exc}")
        return 2
    problems = []
    lookups = [ReverseLookups(t.iface.address) for t in transports]
    try:
        for t in transports:
            print(
                f"  {t.iface.name}: joined the group, send socket {t.local_address[0]}:{t.local_address[1]}"
            )
        if args.job:
            print(f"listening {args.seconds:g}s for other nodes running `doctor --job {args.job}`...")
        heard = _listen(
            transports, _codec(args), args.seconds, me=_nonce() or 1, doctor_job=args.job, probe=True
        )
        send_errors = sum(t.send_errors for t in transports)
    finally:
        for t in transports:
            t.close()
    if send_errors:
        problems.append(f"{send_errors} send(s) failed: a firewall may block multicast output here")
    for lookup in lookups:
        print(lookup.report())
    reached = {}
    for t in transports:
        mcast = sorted(heard.doctors.get((t.iface.name, "multicast"), set()))
        bcast = sorted(heard.doctors.get((t.iface.name, "broadcast"), set()))
        reached[t.iface.name] = mcast
        if args.job:
            print(f"  {t.iface.name}: by multicast {', '.join(mcast) or 'nobody'}; by broadcast ", end="")
            print(", ".join(bcast) or "nobody")
    print(f"datagrams received: {heard.received}")
    for j in sorted(heard.jobs.values(), key=lambda j: j.job):
        leader = (
            f"leader {j.leader_ip}, epoch {j.epoch}, round {j.round}, {j.members} node(s)"
            if j.leader_ip
            else "electing"
        )
        print(f"  job {j.job!r}: {leader}")
    if heard.invalid:
        print(f"  dropped (invalid): {dict(heard.invalid)}")
    for hint in _secret_hints(heard.invalid, signing=args.secret_file is not None):
        print(f"  hint: {hint}")
    if args.job:
        if not any(reached.values()):
            any_bcast = any(ips for (_, path), ips in heard.doctors.items() if path == "broadcast")
            if any_bcast:
                problems.append(
                    "multicast reaches nobody, but broadcast does: the network drops multicast; use "
                    "--rdzv_conf fallback=broadcast (same subnet), or peers=HOST;HOST"
                )
            else:
                problems.append(
                    f"no other node running `doctor --job {args.job}` was heard within {args.seconds:g}s: "
                    "run it on the other nodes at the same time; if they do, multicast (and broadcast) do "
                    "not cross this network: use peers=HOST;HOST (a headless Service's DNS name works) or a "
                    f"network that carries multicast (see {README_NETWORKS})"
                )
        else:
            best = max(reached, key=lambda name: len(reached[name]))
            print(f"OK: multicast reaches {len(reached[best])} other node(s) on {best}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


def _secret_hints(invalid: Counter[str], *, signing: bool) -> list[str]:
    """What the dropped datagrams say about secrets: how to see the jobs they come from."""
    hints = []
    if invalid["unexpected_tag"] and not signing:
        hints.append("signed datagrams arrived: a job here uses a secret; pass its --secret-file to see it")
    if invalid["bad_tag"] and signing:
        hints.append("datagrams signed with another secret arrived: pass that job's --secret-file to see it")
    if invalid["missing_tag"] and signing:
        hints.append(
            "unsigned datagrams arrived: a job here runs without a secret; leave out --secret-file to see it"
        )
    return hints


def run(args: argparse.Namespace, command: Callable[[argparse.Namespace], int] | None = None) -> int:
    """Run the command ``cli`` parsed; a bad setting or network ends with its message, exit code 2."""
    args.group = args.group or DEFAULT_GROUP_V4
    args.port = args.port or DEFAULT_PORT
    try:
        if command is None:
            command = cmd_doctor if args.command == "doctor" else cmd_ls
        return command(args)
    except (MingleConfigError, MingleNetworkError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
