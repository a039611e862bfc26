"""The data path check's parts: which peers a node probes, the probe itself on real sockets, and
the round and status fields that carry it."""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import threading
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_mingle._agent import MAX_PROBES, peers_to_probe
from torch_mingle._datapath import ProbeListener, _address, failure_message, probe
from torch_mingle._records import Round, Status
from torch_mingle._wire import deflated


def test_small_rounds_probe_every_peer():
    assert peers_to_probe(1, 0) == []
    assert peers_to_probe(4, 2) == [0, 1, 3]
    assert len(peers_to_probe(MAX_PROBES + 1, 5)) == MAX_PROBES


@given(world=st.integers(MAX_PROBES + 2, 5000), data=st.data())
def test_large_rounds_probe_a_bounded_set_with_the_ring_neighbours_first(world, data):
    rank = data.draw(st.integers(0, world - 1))
    peers = peers_to_probe(world, rank)
    assert len(peers) == MAX_PROBES == len(set(peers))
    assert rank not in peers and all(0 <= p < world for p in peers)
    assert peers[:2] == [(rank + 1) % world, (rank - 1) % world]


def test_every_pair_of_a_ring_is_probed_from_both_ends():
    world = 1000
    probed = {(r, p) for r in range(world) for p in peers_to_probe(world, r)}
    assert all((r, (r + 1) % world) in probed and ((r + 1) % world, r) in probed for r in range(world))


def test_a_listening_peer_passes_and_a_closed_port_fails_with_the_reason():
    listener = ProbeListener(socket.AF_INET)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()  # nobody listens there now
    try:
        failed, local = probe([(1, "127.0.0.1", listener.port), (2, "127.0.0.1", dead_port)], 2.0)
        assert local == []
        assert [(u.rank, u.port) for u in failed] == [(2, dead_port)]
        assert "refused" in failed[0].why.lower()
        # The listener never accepts by itself: the next check drains what probes left.
        assert listener.drain() == 1
        assert listener.drain() == 0
    finally:
        listener.close()


def test_an_unusable_address_is_this_hosts_problem_not_the_pairs():
    # Garbage from the wire (a leader stores "?" for an unparsable join address), or an IPv4
    # address with a scope: named, never blamed on the path, never an exception.
    failed, local = probe([(3, "?", 1), (4, "127.0.0.1%eth9", 1)], 1.0)
    assert [u.rank for u in local] == [3]
    assert "does not appear to be an IPv4 or IPv6 address" in local[0].why
    assert [u.rank for u in failed] == [4] and "refused" in failed[0].why.lower()


def test_a_link_local_peer_is_reached_through_this_nodes_interface():
    family, addr = _address("fe80::b%ens5", 7, "lo")  # the peer's interface name means nothing here
    assert family == socket.AF_INET6 and addr[0].partition("%")[0] == "fe80::b" and addr[1] == 7
    assert addr[3] == socket.if_nametoindex("lo")


def test_the_message_names_the_pair_the_interface_and_the_fix():
    listener = ProbeListener(socket.AF_INET)
    port = listener.port
    listener.close()
    failed, _ = probe([(2, "127.0.0.1", port)], 1.0)
    text = failure_message((1, "127.0.0.5"), "eth1", failed, 3, 1.0)
    assert "rank 1 (127.0.0.5 on interface eth1)" in text
    assert f"rank 2 at 127.0.0.1 port {port}" in text
    assert "ip route get 127.0.0.1" in text and "interface=NAME" in text and "docs/networks.md" in text


@pytest.mark.parametrize("pports", [[], [1, 2]])
def test_rounds_carry_probe_ports_and_statuses_carry_a_failure(pports):
    rnd = Round(1, 1, (5, 6), "10.0.0.1", 29400, ("10.0.0.1", "10.0.0.2"), (0, 0), tuple(pports))
    assert Round.from_json(rnd.to_json()) == rnd
    said_more = deflated(struct.pack(">III2Q2H", 2, 2, 3, 5, 6, 0, 0))  # 3 probe ports said, none there
    with pytest.raises(ValueError, match="columns"):
        Round.from_json({**rnd.to_json(), "columns": said_more})
    status = Status(epoch=1, round=1, closed=True, failed="node 5 closed the job (data path ...)")
    assert Status.from_json(status.to_json()) == status
    legacy = status.to_json()
    del legacy["failed"]
    assert Status.from_json(legacy).failed == ""


def _unanswering_port() -> tuple[socket.socket, list[socket.socket]]:
    """A port on 127.0.0.1 whose accept queue is full: the kernel drops further SYNs unanswered."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(full.getsockname())
        fillers.append(c)
    return full, fillers


def test_an_unanswered_peer_fails_at_the_deadline_even_when_later_connects_cannot_be_made(monkeypatch):
    full, fillers = _unanswering_port()
    port = full.getsockname()[1]
    made = []

    class OnlyTheFirstConnects(socket.socket):
        def connect_ex(self, addr):
            made.append(addr)
            return super().connect_ex(addr) if len(made) == 1 else errno.EADDRNOTAVAIL

    try:
        monkeypatch.setattr(socket, "socket", OnlyTheFirstConnects)
        failed, local = probe([(1, "127.0.0.1", port)], 1.2, retry_s=0.3)
        monkeypatch.undo()
        # The first connect was out: the retries this host could not make say nothing about
        # the path, and the peer did not answer.
        assert len(made) > 1
        assert local == [] and [u.why for u in failed] == ["no answer within 1.2 s"]
    finally:
        for s in [full, *fillers]:
            s.close()


def test_a_host_out_of_descriptors_probes_nothing_and_blames_no_pair(monkeypatch):
    """EMFILE before the first connect (no selector) is this host's problem: the check names
    the probes it could not make instead of raising from inside ``next_rendezvous``."""

    def no_descriptors() -> selectors.BaseSelector:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(selectors, "DefaultSelector", no_descriptors)
    failed, local = probe([(1, "127.0.0.1", 9), (2, "127.0.0.1", 9)], 1.0)
    assert failed == [] and [u.rank for u in local] == [1, 2]
    assert all("Too many open files" in u.why for u in local)


def test_each_target_is_probed_once_and_a_bad_retry_interval_is_refused():
    listener = ProbeListener(socket.AF_INET)
    try:
        target = (1, "127.0.0.1", listener.port)
        assert probe([target, target], 1.0) == ([], [])
        assert listener.drain() == 1
        with pytest.raises(ValueError, match="retry_s must be > 0"):
            probe([target], 1.0, retry_s=0)
    finally:
        listener.close()


def test_a_peer_that_refuses_at_first_and_then_listens_passes_within_the_deadline():
    """A firewall rule that rejects with a reset, lifted just as the round forms (a partition
    that heals): a retry reaches the peer, and the job does not fail for it."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]  # bound, not listening: a connect to it is refused
    result: list[Any] = []
    prober = threading.Thread(target=lambda: result.append(probe([(1, "127.0.0.1", port)], 5.0)))
    prober.start()
    try:
        time.sleep(0.3)  # the fault's duration: the refusals come first (not a wait for a condition)
        held.listen(8)
        prober.join(10)
        assert not prober.is_alive() and result[0] == ([], [])
    finally:
        held.close()
