"""Hostile networks on 127.0.0.1: floods, forged and replayed datagrams, secrets, many jobs, OS errors."""

from __future__ import annotations

import contextlib
import errno
import logging
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.flood import Flood
from tests.helpers import (
    ROOT,
    dicts_of,
    dump,
    final_reports,
    finish_all,
    random_port,
    rendezvous_all,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
    write_secret,
)
from torch_mingle._protocol import MAX_OTHER_JOBS, MAX_PEERS
from torch_mingle._wire import (
    DUPLICATE_WINDOW_MS,
    MAX_REMEMBERED_NONCES,
    VERSION,
    Announce,
    Codec,
    Datagram,
    Query,
    derive_key,
    encode_frame,
)
from torch_mingle.config import DEFAULT_GROUP_V4
from torch_mingle.errors import MingleConfigError, MingleNetworkError, MingleTimeoutError

pytestmark = pytest.mark.integration

MIN_FLOOD_RATE = 20_000


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_garbage_flood_does_not_stop_a_rendezvous(make_handler, port):
    job = unique_job("flood")
    flood = Flood(DEFAULT_GROUP_V4, port, job, seconds=6, garbage_only=True)
    handlers = [make_handler(job, 3) for _ in range(3)]
    started = time.monotonic()
    infos = rendezvous_all(handlers)
    took = time.monotonic() - started
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    report = flood.result()
    assert report["rate"] >= MIN_FLOOD_RATE, report
    for h in handlers:
        stats = h.diagnostics().stats
        assert stats.dropped_total() > 0, "the flood did not reach this node"
        assert stats.accepted < stats.received
    print(f"rendezvous under a {report['rate']:.0f}/s garbage flood: {took * 1000:.0f} ms")


def test_with_a_secret_a_flood_of_forgeries_and_replays_changes_nothing(make_handler, port, tmp_path):
    job = unique_job("flood-secret")
    secret = write_secret(tmp_path, "secret", "s3cret-for-the-flood-test-0123456789")
    first = [make_handler(job, 3, 4, secret_file=secret, last_call_timeout="0.5") for _ in range(3)]
    # The flood listens first: it records the genuine datagrams of this job to replay them.
    flood = Flood(DEFAULT_GROUP_V4, port, job, seconds=8, capture=1.0)
    rss_before = rss_mib()
    infos = rendezvous_all(first)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    # Now a fourth node arrives in the middle of the flood, and the job re-forms with it.
    newcomer = make_handler(job, 3, 4, secret_file=secret, last_call_timeout="0.5")
    result: dict[str, object] = {}
    joiner = threading.Thread(target=lambda: result.update(info=newcomer.next_rendezvous()))
    started = time.monotonic()
    joiner.start()
    wait_until(lambda: all(h.num_nodes_waiting() == 1 for h in first), 30, "the newcomer to be waiting")
    infos = rendezvous_all(first)
    joiner.join(timeout=60)
    took = time.monotonic() - started
    assert sorted([i.rank for i in infos] + [result["info"].rank]) == [0, 1, 2, 3]  # type: ignore[attr-defined]
    report = flood.result()
    assert report["rate"] >= MIN_FLOOD_RATE, report
    assert report["replays"] > 0, "nothing was captured to replay"
    invalid: dict[str, int] = {}
    for h in [*first, newcomer]:
        diag = h.diagnostics()
        for reason, n in diag.stats.invalid.items():
            invalid[reason] = invalid.get(reason, 0) + n
        assert diag.leader is not None
        assert diag.leader in {f"{x.node_id:016x}" for x in [*first, newcomer]}, "followed a forged leader"
        assert diag.peers_heard <= MAX_PEERS
        assert len(diag.stats.other_jobs) <= MAX_OTHER_JOBS
        assert diag.remembered_nonces <= MAX_REMEMBERED_NONCES
    assert invalid.get("missing_tag", 0) > 0 and invalid.get("bad_tag", 0) > 0, invalid
    assert invalid.get("replayed", 0) > 0, invalid
    assert rss_mib() - rss_before < 100, "memory grew under the flood"
    rate = report["rate"]
    print(f"re-rendezvous under a {rate:.0f}/s flood of forgeries and replays: {took * 1000:.0f} ms")
    print(f"dropped: {invalid}")


def _send(port: int, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        s.sendto(data, (DEFAULT_GROUP_V4, port))


def test_with_a_secret_forged_stale_and_replayed_announcements_are_rejected(make_handler, port, tmp_path):
    job = unique_job("forged")
    secret_text = "another-s3cret-0123456789abcdef"
    secret = write_secret(tmp_path, "secret", secret_text)
    handlers = [make_handler(job, 2, secret_file=secret) for _ in range(2)]
    infos = rendezvous_all(handlers)
    real_leader = next(h for h, i in zip(handlers, infos, strict=True) if i.rank == 0).node_id
    fake = Announce(epoch=99, store_ip="127.0.0.2", store_port=4242)
    now_ms = int(time.time() * 1000)
    wrong = Codec(b"x" * 32).encode(Datagram(job=job, sender=7, body=fake, sent_ms=now_ms, nonce=1))
    unsigned = Codec().encode(Datagram(job=job, sender=7, body=fake, sent_ms=now_ms, nonce=2))
    # Signed with the right key, but a minute old: a capture replayed later.
    stale = Codec(derive_key(secret_text.encode())).encode(
        Datagram(job=job, sender=7, body=fake, sent_ms=now_ms - 60_000, nonce=3)
    )
    # A genuine, signed datagram (a node's query), sent twice at once: the second copy is a
    # duplicate (several paths deliver one datagram), counted quietly; a third copy later than
    # the duplicate window is a replay.
    fresh = Codec(derive_key(secret_text.encode())).encode(
        Datagram(job=job, sender=7, body=Query(epoch_seen=1), sent_ms=now_ms, nonce=4)
    )
    for data in (wrong, unsigned, stale, fresh, fresh):
        _send(port, data)
    wait_until(
        lambda: all(h.diagnostics().stats.invalid["duplicate"] for h in handlers),
        5,
        "the duplicate to arrive",
    )
    time.sleep(DUPLICATE_WINDOW_MS / 1000 + 0.2)  # the window is the point of this step, not a wait
    _send(port, fresh)

    def all_counted() -> bool:
        counts = [h.diagnostics().stats.invalid for h in handlers]
        return all(
            c["replayed"] and c["outside_replay_window"] and c["bad_tag"] and c["missing_tag"] for c in counts
        )

    wait_until(all_counted, 5, "every forged datagram to be counted")
    for h in handlers:
        diag = h.diagnostics()
        assert diag.stats.invalid["bad_tag"] >= 1
        assert diag.stats.invalid["missing_tag"] >= 1
        assert diag.stats.invalid["outside_replay_window"] >= 1
        assert diag.stats.invalid["duplicate"] >= 1  # the second copy of the fresh one
        assert diag.stats.invalid["replayed"] >= 1  # the third copy
        assert (
            diag.stats.dropped_total() == sum(diag.stats.invalid.values()) - diag.stats.invalid["duplicate"]
        )
        assert diag.leader == f"{real_leader:016x}"
        assert h.num_nodes_waiting() == 0


@pytest.mark.parametrize(
    ("first", "second", "says"),
    [
        ("one-secret-0123456789", "other-secret-0123456789", "a different secret"),
        ("one-secret-0123456789", None, "without a secret"),
        (None, "one-secret-0123456789", "this node has none"),
    ],
)
def test_mismatched_secrets_fail_within_join_timeout_and_say_why(make_handler, tmp_path, first, second, says):
    job = unique_job("mismatch")
    conf = [
        {"secret_file": write_secret(tmp_path, f"s{i}", s)} if s else {}
        for i, s in enumerate((first, second))
    ]
    a = make_handler(job, 2, join_timeout="2", **conf[0])
    b = make_handler(job, 2, join_timeout="2", **conf[1])
    failed: dict[int, BaseException] = {}

    def attempt(i, h):
        try:
            h.next_rendezvous()
        except BaseException as exc:  # collected and checked below
            failed[i] = exc

    threads = [threading.Thread(target=attempt, args=(i, h)) for i, h in enumerate((a, b))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert time.monotonic() - started < 2 + 5
    assert sorted(failed) == [0, 1], failed
    errors = [failed[0], failed[1]]
    # A node without a secret that hears its job signed refuses itself at once (it trusts any
    # sender anyway); a node with a secret never fails for what it hears: it times out.
    expected = [MingleConfigError if s is None and other else MingleTimeoutError for s, other in
                ((first, second), (second, first))]  # fmt: skip
    assert [type(e) for e in errors] == expected, errors
    assert any(says in str(e) for e in errors), [str(e) for e in errors]


def test_a_node_of_another_version_is_named_when_the_join_times_out(make_handler, port):
    """Versions differ in what the control connection carries (version 4 packs rounds): a node
    that hears only a node of another version says so, instead of a bare timeout."""
    job = unique_job("versions")
    h = make_handler(job, 2, join_timeout="2")
    old = bytearray(Codec().encode(Datagram(job=job, sender=0xA1D, body=Query(epoch_seen=0))))
    old[4] = VERSION - 1
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            h.next_rendezvous()
        except BaseException as exc:  # checked below
            errors.append(exc)

    joiner = threading.Thread(target=attempt)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        joiner.start()
        deadline = time.monotonic() + 10
        while joiner.is_alive() and time.monotonic() < deadline:
            sock.sendto(bytes(old), (DEFAULT_GROUP_V4, port))  # an old node asking, every 0.1 s
            joiner.join(timeout=0.1)
    joiner.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], MingleTimeoutError), errors
    assert "another torch_mingle version" in str(errors[0]) and "same version" in str(errors[0])


def test_a_port_held_without_reuse_is_named_with_the_fix(make_handler, port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blocker:
        blocker.bind(("0.0.0.0", port))  # noqa: S104 - how another program would hold the port
        with pytest.raises(MingleNetworkError) as err:
            make_handler(unique_job(), 1)
    message = str(err.value)
    assert f"UDP port {port}" in message
    assert "SO_REUSEADDR" in message
    assert "--rdzv_conf port=" in message


def test_four_jobs_of_different_sizes_on_one_group_and_port_complete_and_never_mix(tmp_path):
    port = random_port()
    jobs = {unique_job(f"j{i}"): n for i, n in enumerate((3, 2, 2, 2))}
    agents = []
    for job, n in jobs.items():
        cmd = torchrun_cmd(
            job=job, nnodes=str(n), nproc=1, conf={"interface": "127.0.0.1", "port": port},
            script_args=["--steps", "2", "--quiet", "--report", str(tmp_path / job)],
        )  # fmt: skip
        agents += [start_agent(f"{job}-{i}", cmd, tmp_path) for i in range(n)]
    codes = finish_all(agents, timeout=240)
    assert codes == [0] * 9, dump(agents)
    ports = set()
    for job, n in jobs.items():
        reports = final_reports(tmp_path / job)
        assert sorted(r["rank"] for r in reports) == list(range(n)), dump(agents)
        assert {r["world_size"] for r in reports} == {n}
        (master_port,) = {r["env"]["MASTER_PORT"] for r in reports}
        ports.add(master_port)
    assert len(ports) == 4, "two jobs shared a store"


def test_without_a_secret_one_warning_per_process_and_counters_in_the_debug_log(tmp_path):
    code = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(levelname)s %(message)s")
from concurrent.futures import ThreadPoolExecutor
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch_mingle.handler import MingleRendezvousHandler
hs = [MingleRendezvousHandler.from_params(RendezvousParameters(
    "mingle", "", sys.argv[1], 2, 2, interface="127.0.0.1", port=sys.argv[2])) for _ in range(2)]
with ThreadPoolExecutor(2) as pool:
    list(pool.map(lambda h: h.next_rendezvous(), hs))
    list(pool.map(lambda h: h.shutdown(), hs))
"""
    run = subprocess.run(
        [sys.executable, "-c", code, unique_job("nosecret"), str(random_port())],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [line for line in run.stdout.splitlines() if "runs without a secret" in line]
    assert len(warnings) == 1, warnings
    assert "anyone who can send to 239.255.77.77" in warnings[0]
    assert "secret_file=PATH" in warnings[0]
    counters = [line for line in run.stdout.splitlines() if "round 1 discovery counters" in line]
    assert len(counters) == 2 and "datagrams received" in counters[0], run.stdout[-3000:]


@pytest.mark.parametrize("as_member", [False, True], ids=["a-new-node", "a-member's-id"])
def test_with_a_secret_a_host_without_it_can_neither_join_nor_evict_nor_stir_the_job(
    make_handler, tmp_path, as_member
):
    """A host on the segment reads a signed announcement (signed, not encrypted): the leader's
    epoch and control port. Without the secret, its hello and join on that port are refused:
    no member is evicted, and ``num_nodes_waiting()`` stays 0 on every node."""
    job = unique_job("rogue")
    secret = write_secret(tmp_path, "secret", "the-job's-s3cret-0123456789abcdef")
    handlers = [make_handler(job, 2, 3, secret_file=secret, last_call_timeout="0.5") for _ in range(2)]
    rendezvous_all(handlers)
    leader = next(h for h in handlers if h.diagnostics().is_leader)
    member = next(h for h in handlers if h is not leader)
    before = leader.diagnostics()
    node = f"{member.node_id:016x}" if as_member else "00000000deadbeef"
    hello = encode_frame(
        "hello", node=node, epoch=before.epoch, leader=before.leader, ip="127.0.0.1", ahead=True
    )
    join = encode_frame("join", id=1, ip="127.0.0.1", timeout_s=60, remaining_s=60)
    with socket.create_connection(("127.0.0.1", before.leader_port), timeout=5) as rogue:
        rogue.sendall(hello + join)
        got = b""
        while chunk := rogue.recv(65536):  # until the leader closes it (bounded by the timeout)
            got += chunk
    frames = dicts_of(got)
    assert [f["t"] for f in frames] == ["challenge"], frames
    after = leader.diagnostics()
    assert after.connected_nodes == before.connected_nodes == 1
    assert after.control.joins == before.control.joins, "the leader counted the rogue's join"
    assert [h.num_nodes_waiting() for h in handlers] == [0, 0]
    assert member.diagnostics().trouble is None and member.diagnostics().round == before.round


class _ConnectionStorm:
    """A host without the secret (127.0.0.66) that holds ``size`` connections to a control port,
    says no hello (every third one sends junk instead), and reopens each one that is closed."""

    def __init__(self, port: int, size: int) -> None:
        self.port, self.size = port, size
        self.opened = self.closed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-storm", daemon=True)

    def __enter__(self) -> _ConnectionStorm:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                while len(sel.get_map()) < self.size and not self._stop.is_set():
                    sock = socket.socket()
                    sock.bind(("127.0.0.66", 0))
                    sock.setblocking(False)
                    if sock.connect_ex(("127.0.0.1", self.port)) not in (0, errno.EINPROGRESS):
                        sock.close()
                        break
                    self.opened += 1
                    if self.opened % 3 == 0:
                        with contextlib.suppress(OSError):
                            sock.send(b"\x00\x00\x00\x05junk!")
                    sel.register(sock, selectors.EVENT_READ, sock)
                for key, _ in sel.select(timeout=0.05):
                    held: socket.socket = key.data
                    try:
                        data = held.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(held)
                        held.close()
                        self.closed += 1
        finally:
            for key in list(sel.get_map().values()):
                key.data.close()
            sel.close()


def test_with_a_secret_a_storm_of_connections_without_it_never_keeps_a_node_out(make_handler, tmp_path):
    """3,000 connections that never say hello, reopened as soon as they are closed: a new node
    still gets in at once (the storm's own oldest connections give way to every new one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 20000)), hard))
    try:
        job = unique_job("storm")
        secret = write_secret(tmp_path, "secret", "the-job's-s3cret-0123456789abcdef")
        handlers = [make_handler(job, 2, 3, secret_file=secret, last_call_timeout="0.5") for _ in range(2)]
        rendezvous_all(handlers)
        leader = next(h for h in handlers if h.diagnostics().is_leader)
        with _ConnectionStorm(leader.diagnostics().leader_port, 3000) as storm:
            wait_until(lambda: storm.closed > 1500, 60, "the storm to fill the leader's table and more")
            newcomer = make_handler(job, 2, 3, secret_file=secret, last_call_timeout="0.5")
            with ThreadPoolExecutor(1) as pool:
                joining = pool.submit(newcomer.next_rendezvous)
                try:
                    wait_until(
                        lambda: all(h.num_nodes_waiting() > 0 for h in handlers), 20, "the newcomer in"
                    )
                    infos = [*rendezvous_all(handlers), joining.result(timeout=30)]
                finally:
                    if not joining.done():
                        newcomer.shutdown()
        assert {i.world_size for i in infos} == {3}
        assert storm.closed > 1500, (storm.opened, storm.closed)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _rendezvous_in_background(handlers) -> list[threading.Thread]:
    def attempt(h):
        with contextlib.suppress(Exception):  # each times out: the test reads the log meanwhile
            h.next_rendezvous()

    threads = [threading.Thread(target=attempt, args=(h,), daemon=True) for h in handlers]
    for t in threads:
        t.start()
    return threads


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def _both_warn_early(handlers, said: str, within_s: float, caplog) -> list[str]:
    """Run both handlers' joins (each times out) until both have warned with ``said`` within
    ``within_s``; their warnings with it. Neither may blame multicast."""
    with caplog.at_level(logging.WARNING, logger="torch_mingle"):
        threads = _rendezvous_in_background(handlers)
        wait_until(lambda: sum(said in m for m in _warnings(caplog)) >= 2, within_s, "both early warnings")
        for t in threads:
            t.join(timeout=20)
    assert not any("multicast does not reach" in m for m in _warnings(caplog)), _warnings(caplog)
    return [m for m in _warnings(caplog) if said in m]


def test_another_secret_is_named_at_the_early_warning_without_multicast_advice(
    make_handler, tmp_path, caplog
):
    """Two nodes of one job with different secrets: within discovery_warning each says that it
    hears its job only in datagrams signed with another secret, not that multicast is blocked."""
    job = unique_job("other-secret")
    conf = {"join_timeout": "4", "discovery_warning": "1"}
    a = make_handler(job, 2, secret_file=write_secret(tmp_path, "a", "first-secret-0123456789"), **conf)
    b = make_handler(job, 2, secret_file=write_secret(tmp_path, "b", "second-secret-0123456789"), **conf)
    early = _both_warn_early([a, b], "naming the job arrived that this node must drop (bad_tag", 3.5, caplog)
    assert all("a different secret" in m for m in early), early


def test_another_version_is_named_at_the_early_warning(make_handler, port, caplog):
    job = unique_job("other-version")
    h = make_handler(job, 2, join_timeout="4", discovery_warning="1")
    old = bytearray(Codec().encode(Datagram(job=job, sender=0xA1D, body=Query(epoch_seen=0))))
    old[4] = VERSION - 1
    with caplog.at_level(logging.WARNING, logger="torch_mingle"):
        (thread,) = _rendezvous_in_background([h])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            deadline = time.monotonic() + 3.5
            while not any("naming the job arrived" in m for m in _warnings(caplog)):
                assert time.monotonic() < deadline, _warnings(caplog)
                sock.sendto(bytes(old), (DEFAULT_GROUP_V4, port))  # an old node asking, every 0.1 s
                thread.join(timeout=0.1)
        thread.join(timeout=20)
    (early,) = [m for m in _warnings(caplog) if "naming the job arrived" in m]
    assert "bad_version" in early and "another torch_mingle version" in early, early


def test_a_job_of_one_node_says_nothing_of_other_nodes_where_a_job_of_two_does(make_handler, caplog):
    """--nnodes=1 has nobody to hear: no 'multicast blocked' warning. A lonely node of a job of
    two, started after it with the same discovery_warning, is the clock: once it has warned,
    the job of one would have."""
    one = make_handler(unique_job("alone-by-design"), 1, discovery_warning="0.5")
    lonely = make_handler(unique_job("lonely"), 2, join_timeout="3", discovery_warning="0.5")
    with caplog.at_level(logging.WARNING, logger="torch_mingle"):
        assert one.next_rendezvous().rank == 0
        (thread,) = _rendezvous_in_background([lonely])
        wait_until(
            lambda: any("lonely" in m and "no other node" in m for m in _warnings(caplog)), 3, "the warning"
        )
        thread.join(timeout=20)
    # The lonely node may name the job of one among the other jobs it heard; the job of one says nothing.
    assert not any("no other node of job 'alone-by-design" in m for m in _warnings(caplog)), _warnings(caplog)


def test_a_job_id_that_differs_is_named_at_the_early_warning_with_the_closest_one(make_handler, caplog):
    """Two nodes started with job ids that differ by a typo: within discovery_warning each names
    the other's job id as the one it may have meant, instead of blaming the network."""
    job = unique_job("typo")
    conf = {"join_timeout": "4", "discovery_warning": "1"}
    a, b = make_handler(job, 2, **conf), make_handler(job + "x", 2, **conf)
    early = _both_warn_early([a, b], "but nodes of other jobs are heard", 3.5, caplog)
    assert any(f"did you mean {job + 'x'!r}?" in m for m in early), early
    assert any(f"did you mean {job!r}?" in m for m in early), early
