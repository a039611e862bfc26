"""Input the field produces on purpose or by accident: forged epochs, slow writers, clock steps, re-runs."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import rendezvous_all, unique_job
from torch_mingle import _loop
from torch_mingle._records import Round
from torch_mingle._wire import (
    EPOCH_MAX,
    Announce,
    Body,
    Codec,
    Datagram,
    FrameReader,
    Query,
    Resign,
    encode_frame,
)
from torch_mingle.config import DEFAULT_GROUP_V4
from torch_mingle.errors import MingleClosedError

pytestmark = pytest.mark.integration


def _send(port: int, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        s.sendto(data, (DEFAULT_GROUP_V4, port))


def test_forged_datagrams_with_the_largest_epochs_never_stop_an_election(make_handler, port):
    job = unique_job("epochs")
    # A wide election window: the forgeries arrive while every node is still electing.
    handlers = [make_handler(job, 3, election_window="0.5") for _ in range(3)]
    now_ms = int(time.time() * 1000)
    forged: list[Body] = [
        Query(epoch_seen=2**32 - 1),
        Query(epoch_seen=EPOCH_MAX),
        Announce(epoch=EPOCH_MAX, store_ip="127.0.0.9", store_port=9, established=True),
        Resign(epoch=EPOCH_MAX),
    ]
    for i, body in enumerate(forged):
        _send(port, Codec().encode(Datagram(job=job, sender=0xBAD0 + i, body=body, sent_ms=now_ms, nonce=i)))
    infos = rendezvous_all(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    for h in handlers:
        diag = h.diagnostics()
        assert diag.epoch < 2**20, diag
        assert diag.leader in {f"{x.node_id:016x}" for x in handlers}
        assert diag.stats.invalid["epoch_jump"] >= 1, diag.stats


def test_a_node_that_writes_slowly_is_answered_and_blocks_nobody(make_handler):
    """Two real nodes and a third that dribbles its hello and join a byte at a time over 3 s."""
    job = unique_job("slow")
    real = [make_handler(job, 3) for _ in range(2)]
    diag = real[0].wait_diagnostics(lambda d: d.leader is not None, 10)
    assert diag is not None and diag.leader_ip is not None
    leader = (diag.leader_ip, diag.leader_port)
    # A connection that never finishes its first frame: the leader must not wait for it.
    stalled = socket.create_connection(leader, timeout=5)
    stalled.sendall(b"\x00\x00")
    result: dict[str, Any] = {}
    joiner = threading.Thread(target=lambda: result.update(infos=rendezvous_all(real)))
    joiner.start()
    node = "00000000000000aa"
    frames = encode_frame(
        "hello", node=node, epoch=diag.epoch, leader=diag.leader, ip="127.0.0.1", history=None
    )
    frames += encode_frame("join", id=1, ip="127.0.0.1", history=None, timeout_s=60)
    with socket.create_connection(leader, timeout=5) as slow:
        for i in range(len(frames)):
            slow.sendall(frames[i : i + 1])
            time.sleep(3.0 / len(frames))  # the fault under test: a writer this slow
        reader, answer, proposed = FrameReader(dict), None, {}
        deadline = time.monotonic() + 20
        while answer is None and time.monotonic() < deadline:
            read = reader.feed(slow.recv(65536))
            assert isinstance(read, list)
            got: list[dict[str, Any]] = [f.frame for f in read]  # type: ignore[misc]
            for m in got:
                if m.get("t") == "propose":  # it votes, as every member of a first round must
                    proposed[m["round"]["round"]] = m["round"]
                    slow.sendall(encode_frame("accept", round=m["round"]["round"], ok=True))
            answer = next((m for m in got if m.get("t") == "round"), None)
    joiner.join(timeout=30)
    stalled.close()
    assert answer is not None, "the slow writer's join was lost"
    # The round itself, or (it was proposed on this connection) its number.
    rnd = answer["round"] if "round" in answer else proposed[answer["number"]]
    assert int(node, 16) in Round.from_json(rnd).members
    assert [i.world_size for i in result["infos"]] == [3, 3]


def test_a_clock_step_after_start_does_not_split_a_signed_job(make_handler, tmp_path: Path, monkeypatch):
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-the-clock-step-test\n")
    secret.chmod(0o600)
    job = unique_job("ntp")
    first = make_handler(job, 2, secret_file=str(secret))
    first.wait_diagnostics(lambda d: d.leader is not None, 10)
    # NTP steps the clock an hour ahead after the first node started: both nodes now read the
    # new time, and the first must sign with it, or the second rejects it as a replay.
    monkeypatch.setattr(_loop, "wall_clock", lambda: time.time() + 3600)
    second = make_handler(job, 2, secret_file=str(secret))
    infos = rendezvous_all([first, second])
    assert sorted(i.rank for i in infos) == [0, 1]


def test_a_node_that_only_ever_sees_the_job_finished_fails_and_says_use_a_new_id(make_handler):
    job = unique_job("rerun")
    handlers = [make_handler(job, 2) for _ in range(2)]
    rendezvous_all(handlers)
    handlers[1].set_closed()  # the job is over; its leader is still up (e.g. in close_timeout)
    for h in handlers:
        assert h.wait_diagnostics(lambda d: d.closed, 10) is not None
    late = make_handler(job, 2)  # the same --rdzv_id, reused by mistake
    with pytest.raises(MingleClosedError, match=r"already finished.*use a new --rdzv_id"):
        late.next_rendezvous()


def _hello_then(leader: tuple[str, int], diag, node: str, *frames: bytes) -> bytes:
    """Say hello with the right claim as ``node``, send ``frames``, return what came back (1 s)."""
    hello = encode_frame("hello", node=node, epoch=diag.epoch, leader=diag.leader, ip="127.0.0.1")
    with socket.create_connection(leader, timeout=5) as s:
        s.sendall(hello + b"".join(frames))
        s.settimeout(1.0)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += chunk
    return got


def _raw_frame(text: str) -> bytes:
    body = text.encode()
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    "frame",
    [
        _raw_frame(
            '{"t":"join","id":1,"ip":"127.0.0.1","history":{"epoch":1e400,"round":1,"members":["a"]}}'
        ),
        _raw_frame(
            '{"t":"join","id":1,"ip":"127.0.0.1","history":{"epoch":1,"round":'
            + "9" * 4000
            + ',"members":[]}}'
        ),
        _raw_frame('{"t":"join","id":1,"ip":"127.0.0.1","history":{"epoch":NaN,"round":1,"members":[]}}'),
        _raw_frame('{"t":"join","id":1,"ip":"127.0.0.1%' + "x" * 100_000 + '","history":null}'),
        _raw_frame('{"t":"join","id":1,"ip":"127.0.0.1","history":null,"timeout_s":1e-300}'),
        _raw_frame(
            '{"t":"join","id":1,"ip":"127.0.0.1","history":{"epoch":1,"round":1,"members":['
            + '"ff",' * 99_999
            + '"ff"]}}'
        ),
        _raw_frame('{"t":"arrive","id":1,"round":1,"epoch":"x"}'),
        _raw_frame('{"t":"join","id":1,"ip":"127.0.0.1","x":' + "[" * 900 + "]" * 900 + "}"),
    ],
    ids=["infinite", "huge-round", "nan", "long-scope", "tiny-timeout", "many-members", "bad-epoch", "deep"],
)
def test_a_hostile_frame_on_the_control_port_costs_only_its_connection(make_handler, frame):
    job = unique_job("evil")
    real = [make_handler(job, 2) for _ in range(2)]
    rendezvous_all(real)
    diag = real[0].diagnostics()
    assert diag.leader_ip is not None
    _hello_then((diag.leader_ip, diag.leader_port), diag, "00000000000000ee", frame)
    infos = rendezvous_all(real)  # a re-rendezvous: the leader neither resigned nor lost its way
    assert sorted(i.rank for i in infos) == [0, 1]
    leader = next(h for h in real if h.diagnostics().is_leader)
    assert leader.diagnostics().recoveries == 0
    assert leader.diagnostics().epoch == diag.epoch


def test_someone_saying_hello_with_a_nodes_id_does_not_cut_it_off(make_handler):
    job = unique_job("spoof")
    real = [make_handler(job, 2) for _ in range(2)]
    infos = rendezvous_all(real)
    follower = next(h for h, i in zip(real, infos, strict=True) if i.rank == 1)
    diag = follower.diagnostics()
    assert diag.leader_ip is not None
    _hello_then((diag.leader_ip, diag.leader_port), diag, diag.node_id)  # its id, from someone else
    # It is told it was superseded and connects again; it never takes the leader for dead.
    again = follower.wait_diagnostics(lambda d: d.status is not None and d.epoch == diag.epoch, 10)
    assert again is not None, again
    assert follower.num_nodes_waiting() in (0, 1)
    infos = rendezvous_all(real)  # a worker restart later: the same two, the same leader
    assert sorted(i.rank for i in infos) == [0, 1]
    assert follower.diagnostics().epoch == diag.epoch
