"""MingleRendezvousHandler in-process, over real multicast on 127.0.0.1 and real TCPStores."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousTimeoutError

from tests.helpers import random_port, rendezvous_all, unique_job, wait_until
from torch_mingle._store import open_server
from torch_mingle.errors import MingleClosedError, MingleConfigError, MingleTimeoutError
from torch_mingle.handler import MingleRendezvousHandler


def test_four_nodes_agree_on_ranks_and_on_rank_0s_store(make_handler):
    job = unique_job()
    handlers = [make_handler(job, 4) for _ in range(4)]
    infos = rendezvous_all(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2, 3]
    assert {i.world_size for i in infos} == {4}
    stores = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos}
    assert len(stores) == 1
    assert stores.pop()[0] == "127.0.0.1"
    (leader,) = [h for h in handlers if h.diagnostics().is_leader]
    assert infos[handlers.index(leader)].rank == 0
    # Every agent's store is the same server: what one writes, all read.
    infos[3].store.set("hello", f"from rank {infos[3].rank}")
    assert {i.store.get("hello") for i in infos} == {f"from rank {infos[3].rank}".encode()}
    assert [h.num_nodes_waiting() for h in handlers] == [0, 0, 0, 0]


def test_nodes_connect_to_the_next_rounds_store_ahead_of_time(make_handler, caplog):
    job = unique_job()
    handlers = [make_handler(job, 3) for _ in range(3)]
    early, last = handlers[:2], handlers[2]
    with caplog.at_level(logging.DEBUG, logger="torch_mingle"), ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(h.next_rendezvous) for h in early]
        for h in early:  # the leader and a follower, both waiting for the third node
            assert h.wait_diagnostics(lambda d: d.store_ahead, 10.0) is not None, h.diagnostics()
        futures.append(pool.submit(last.next_rendezvous))
        infos = [f.result(timeout=30) for f in futures]
    ahead = [r.getMessage() for r in caplog.records if "was connected ahead" in r.getMessage()]
    assert len(ahead) >= 2, ahead  # both early nodes used the client they opened while waiting
    infos[0].store.set("k", "v")
    assert [i.store.get("k") for i in infos] == [b"v"] * 3  # the same store, through every client
    # While the round runs, every member (the last one too) connects to the next round's store,
    # so a re-rendezvous after a failure costs no connect either.
    for h in handlers:
        assert h.wait_diagnostics(lambda d: d.store_ahead, 10.0) is not None, h.diagnostics()


def test_a_lone_node_times_out_with_a_message_that_says_what_to_do(make_handler):
    handler = make_handler(unique_job("lonely"), 2, join_timeout="1.5")
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as err:
        handler.next_rendezvous()
    assert time.monotonic() - started < 1.5 + 1.0
    assert isinstance(err.value, MingleTimeoutError)
    message = str(err.value)
    assert "interface lo (127.0.0.1)" in message
    assert "group 239.255.77.77 port" in message
    assert "this node leads" in message
    assert "1 of min_nodes=2 nodes joined" in message
    assert "heard 0 other node(s) of this job" in message
    assert "What to try:" in message


def test_the_timeout_message_names_the_other_jobs_it_heard(make_handler):
    other = make_handler(unique_job("other"), 1)
    rendezvous_all([other])
    handler = make_handler(unique_job("mine"), 2, join_timeout="1.5")
    with pytest.raises(MingleTimeoutError) as err:
        handler.next_rendezvous()
    assert f"datagrams of other jobs: '{other.get_run_id()}'" in str(err.value)
    assert "same --rdzv_id" in str(err.value)


def test_invalid_config_fails_at_creation_with_the_value(make_handler):
    with pytest.raises(MingleConfigError, match="interface='nosuch0' matches no interface"):
        make_handler(unique_job(), 1, interface="nosuch0")
    with pytest.raises(MingleConfigError, match="keep_alive_interval='often'"):
        make_handler(unique_job(), 1, keep_alive_interval="often")


def test_a_newcomer_is_counted_then_admitted_at_the_next_round(make_handler):
    job = unique_job()
    first = [make_handler(job, 2, 3, last_call_timeout="0.3") for _ in range(2)]
    infos = rendezvous_all(first)
    assert {i.world_size for i in infos} == {2}
    newcomer = make_handler(job, 2, 3, last_call_timeout="0.3")
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(info=newcomer.next_rendezvous()))
    t.start()
    for h in first:
        wait_until(lambda h=h: h.num_nodes_waiting() == 1, 10.0, "the running nodes to see the newcomer")
    infos = rendezvous_all(first)
    t.join(timeout=10)
    ranks = {h.node_id: i.rank for h, i in zip(first, infos, strict=True)}
    ranks[newcomer.node_id] = result["info"].rank
    assert sorted(ranks.values()) == [0, 1, 2]
    assert ranks[newcomer.node_id] == 2  # members of the last round keep their ranks
    assert {i.world_size for i in infos} == {3}


def test_set_closed_is_seen_by_everyone_and_ends_further_rounds(make_handler):
    job = unique_job()
    handlers = [make_handler(job, 2) for _ in range(2)]
    rendezvous_all(handlers)
    handlers[1].set_closed()
    wait_until(handlers[0].is_closed, 5.0, "the close to propagate")
    with pytest.raises(MingleClosedError):
        handlers[0].next_rendezvous()


def test_shutdown_leaves_no_thread_and_no_socket_behind():
    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    job, port = unique_job(), str(random_port())
    # torch opens one pipe for good the first time a TCPStore runs in a process: not ours.
    warm_up = open_server("127.0.0.1")
    del warm_up
    gc.collect()
    before = open_fds()
    handlers = [
        MingleRendezvousHandler.from_params(
            RendezvousParameters("mingle", "", job, 3, 3, interface="127.0.0.1", port=port)
        )
        for _ in range(3)
    ]
    infos = rendezvous_all(handlers)
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    del infos
    with ThreadPoolExecutor(max_workers=3) as pool:
        assert all(pool.map(lambda h: h.shutdown(), handlers))
    del handlers
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("mingle-")], 10, "threads")
    gc.collect()
    wait_until(lambda: open_fds() <= before, 10, f"sockets to close: {sorted(open_fds() - before)}")


def test_a_join_that_waits_loads_the_codec_torchs_agent_needs_after_the_rendezvous(port):
    """torch's agent looks this host's name up as next_rendezvous() returns, which imports the
    IDNA codec the first time: a join that waits loads it meanwhile (a fresh process)."""
    script = f"""
import sys
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch_mingle.errors import MingleTimeoutError
from torch_mingle.handler import MingleRendezvousHandler
before = "encodings.idna" in sys.modules
params = RendezvousParameters(
    "mingle", "", {unique_job("idna")!r}, 2, 2, interface="127.0.0.1", port="{port}", join_timeout="1"
)
handler = MingleRendezvousHandler.from_params(params)
try:
    handler.next_rendezvous()
except MingleTimeoutError:
    pass
finally:
    handler.shutdown()
print("before", before, "after", "encodings.idna" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["before", "False", "after", "True"], done.stdout + done.stderr[-3000:]


@pytest.mark.parametrize("policy", ["host", "env:SLURM_NODEID", "topology", "arrival"])
def test_ranks_follow_the_rank_order_policy_from_the_leader_around(make_handler, monkeypatch, policy):
    # Four nodes: node-names, node ids and topology labels all in one order that the
    # arrival (creation) order does not follow.
    places = ["node7", "node66", "node2", "node10"]
    racks = ["r1/b", "r2/a", "r1/a", "r2/b"]
    job, handlers = unique_job("order"), []
    for i, name in enumerate(places):
        monkeypatch.setattr("torch_mingle._order.socket.gethostname", lambda name=name: name)
        monkeypatch.setenv("SLURM_NODEID", str(int(name[4:])))
        monkeypatch.setenv("TORCH_MINGLE_TOPOLOGY", racks[i])
        handlers.append(make_handler(job, 4, rank_order=policy))
    infos = rendezvous_all(handlers)
    by_rank = [places[i] for i in sorted(range(4), key=lambda i: infos[i].rank)]
    (leader,) = [i for i, h in enumerate(handlers) if h.diagnostics().is_leader]
    assert by_rank[0] == places[leader]
    expected = {
        "host": ["node2", "node7", "node10", "node66"],
        "env:SLURM_NODEID": ["node2", "node7", "node10", "node66"],
        "topology": ["node2", "node7", "node66", "node10"],  # r1/a, r1/b, r2/a, r2/b
    }.get(policy)
    if expected is None:  # arrival: the leader, then the others as they joined
        assert sorted(by_rank) == sorted(places)
        return
    at = expected.index(places[leader])
    assert by_rank == expected[at:] + expected[:at]
    # The next round keeps the order: same members, same leader, same ranks.
    again = rendezvous_all(handlers)
    assert [i.rank for i in again] == [i.rank for i in infos]


def test_a_leader_whose_health_check_runs_long_does_not_hold_the_next_round(make_handler, tmp_path):
    """Round 1 of three (``--nnodes=1:3``); then the leader's check runs long before its next
    join (a slow GPU probe, 15 s). Past the heartbeat timeout it gives up leading: another node leads,
    and the two others (a majority of round 1's votes) form the next round without it, instead
    of every member waiting for that join. (A job of two needs its vote: it waits.)"""
    job = unique_job("slowcheck")
    slow = tmp_path / "slow"
    conf = {"last_call_timeout": "0.5", "keep_alive_interval": "0.2"}
    first = make_handler(job, 1, 3, health_check=f"test ! -e {slow} || sleep 15", **conf)
    assert first.wait_diagnostics(lambda d: d.is_leader, 10.0) is not None, first.diagnostics()
    others = [make_handler(job, 1, 3, health_check="true", **conf) for _ in range(2)]
    infos = rendezvous_all([first, *others])
    assert {i.world_size for i in infos} == {3} and infos[0].rank == 0
    slow.touch()
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(first.next_rendezvous)
        try:
            started = time.monotonic()
            again = rendezvous_all(others)
            took = time.monotonic() - started
        finally:
            slow.unlink()
            first.shutdown()  # (its check still sleeps: its join ends with the handler)
            with contextlib.suppress(Exception):
                stuck.result(timeout=60)
    assert {i.world_size for i in again} == {2} and sorted(i.rank for i in again) == [0, 1]
    assert took < 10, f"the next round waited {took:.1f}s for the leader's health check"


def test_a_node_whose_health_check_fails_stays_out_and_the_others_go_on(make_handler, tmp_path):
    """Three nodes, one sick (its check fails: exit 1, with a message). It leads at first: it
    gives up leadership, the two others form their round, and its own join fails at
    ``join_timeout`` with the check's output."""
    job = unique_job("health")
    sick = make_handler(job, 2, 3, health_check="echo 'GPU 1: ECC errors' >&2; exit 1", join_timeout="12",
                        last_call_timeout="1")  # fmt: skip
    assert sick.wait_diagnostics(lambda d: d.is_leader, 10.0) is not None, sick.diagnostics()
    with ThreadPoolExecutor(3) as pool:
        sick_join = pool.submit(sick.next_rendezvous)
        assert sick.wait_diagnostics(lambda d: not d.is_leader, 10.0) is not None, sick.diagnostics()
        healthy = [make_handler(job, 2, 3, health_check="true", last_call_timeout="1") for _ in range(2)]
        infos = list(pool.map(lambda h: h.next_rendezvous(), healthy))
        assert sorted(i.rank for i in infos) == [0, 1] and {i.world_size for i in infos} == {2}
        with pytest.raises(MingleTimeoutError) as err:
            sick_join.result(timeout=60)
    message = str(err.value)
    assert "health check `echo 'GPU 1: ECC errors' >&2; exit 1` kept failing" in message
    assert "it exited with status 1" in message and "GPU 1: ECC errors" in message
    # torch's agent shuts the sick node's handler down: it leaves, the job stays open, and the
    # others' next round forms (a close would make their next_rendezvous() fail).
    sick.shutdown()
    again = rendezvous_all(healthy)
    assert sorted(i.rank for i in again) == [0, 1]


@pytest.mark.parametrize(
    ("nodes", "conf", "said"),
    [
        ((3, 3), {}, "nnodes is 3:3 on this node and 2:2 in the job"),
        ((2, 2), {"quorum": "none"}, "quorum is none on this node and majority in the job"),
        ((2, 2), {"rank_order": "arrival"}, "rank_order is arrival on this node and host in the job"),
    ],
)
def test_a_node_with_other_settings_is_refused_in_seconds_naming_them(
    make_handler, caplog, nodes, conf, said
):
    """The leader's settings are the job's: a node started with others fails at once with both
    values and the fix (not as a spare that waits as long as the job runs), and the leader says
    whom it refused."""
    job = unique_job("misfit")
    leader = make_handler(job, 2, 2, join_timeout="5")

    def wait_for_a_round() -> None:
        with contextlib.suppress(Exception):  # it times out: the test is about the other node
            leader.next_rendezvous()

    waiting = threading.Thread(target=wait_for_a_round, daemon=True)
    waiting.start()
    wait_until(lambda: leader.diagnostics().is_leader, 10, "the first node leads")
    odd = make_handler(job, *nodes, join_timeout="30", **conf)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="torch_mingle"), pytest.raises(MingleConfigError) as err:
        odd.next_rendezvous()
    assert time.monotonic() - started < 5
    assert said in str(err.value) and "Start every node of the job with the same" in str(err.value), err.value
    refused = [r.getMessage() for r in caplog.records if "refused node" in r.getMessage()]
    assert refused and said.replace("this node", "that node") in refused[0], refused
    waiting.join(timeout=20)
