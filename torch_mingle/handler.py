"""``MingleRendezvousHandler``: torch's ``RendezvousHandler`` contract on discovery and rounds.

Creating the handler picks the interface, opens the multicast sockets and starts
discovery at once, so the election overlaps torchrun's own set-up. ``next_rendezvous``
waits for a leader, joins the next round on the leader's store and hands the agent that
round's fresh store, whose address is the leader's IP: the one every node just reached.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from typing import NoReturn

from torch.distributed import DistError
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

from torch_mingle import BACKEND_NAME
from torch_mingle._driver import Driver
from torch_mingle._interfaces import Interface, discovery_interfaces, family_of, interface_for
from torch_mingle._liveness import LivenessClient
from torch_mingle._protocol import Claim, Discovery, LeaderView, Timing
from torch_mingle._rounds import History, Round, RoundBook, Status, node_hex
from torch_mingle._store import (
    JoinAborted,
    JoinClosed,
    JoinTimeout,
    LeaderHost,
    LeaderUnreachable,
    MemberSession,
)
from torch_mingle._transport import McastTransport, PeerList
from torch_mingle._wire import REPLAY_WINDOW_MS, Codec, derive_key
from torch_mingle.config import MingleConfig
from torch_mingle.errors import (
    README_NETWORKS,
    README_SECURITY,
    MingleClosedError,
    MingleConfigError,
    MingleStateError,
    MingleTimeoutError,
)

log = logging.getLogger(__name__)

#: Set for the workers (to the discovery interface) unless the user set them.
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
MAX_CONNECT_TIMEOUT_S = 5.0


def _log_to_stderr_if_asked() -> None:
    """``TORCH_MINGLE_LOG=info|debug``: show our logs under torchrun, which only prints its own."""
    level = os.environ.get("TORCH_MINGLE_LOG", "").upper()
    root = logging.getLogger("torch_mingle")
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR") or root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s mingle %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


_warned_unauthenticated = False


def _warn_unauthenticated_once(config: MingleConfig) -> None:
    global _warned_unauthenticated  # noqa: PLW0603 - once per process, as promised in the README
    if _warned_unauthenticated:
        return
    _warned_unauthenticated = True
    log.warning(
        "mingle runs without a secret: anyone who can send to %s port %d can join job %r or pretend to "
        "lead it; set --rdzv_conf secret_file=PATH (or $TORCH_MINGLE_SECRET_FILE) on every node (%s)",
        config.group,
        config.port,
        config.run_id,
        README_SECURITY,
    )


def _wildcard(family: int) -> str:
    return "::" if family == socket.AF_INET6 else "0.0.0.0"  # noqa: S104 - a leader on several networks


def _loopback(family: int) -> str:
    return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def _new_node_id() -> int:
    return secrets.randbits(64) or 1


def _resolve_ip(addr: str, family: int) -> str:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(addr.split("%", 1)[0])
        return addr
    try:
        infos = socket.getaddrinfo(addr, None, family, socket.SOCK_STREAM)
    except OSError as exc:
        raise MingleConfigError(f"--local-addr {addr!r} does not resolve to an address: {exc}") from exc
    return str(infos[0][4][0])


class MingleRendezvousHandler(RendezvousHandler):
    """The ``mingle`` backend: no endpoint, no MASTER_ADDR; rank 0 is found by multicast."""

    def __init__(self, config: MingleConfig, *, node_id: int | None = None) -> None:
        _log_to_stderr_if_asked()
        self._config = config
        family = family_of(config.group)
        self._ifaces, why = discovery_interfaces(config.interface, family, local_addr=config.local_addr)
        # With several interfaces and no pin, every one listens; the node settles on the one its
        # job's peers answer on, and the stores of a leader listen on all of them.
        self._multi = len(self._ifaces) > 1
        self._iface = self._ifaces[0]
        self._ip = _resolve_ip(config.local_addr, family) if config.local_addr else self._iface.address
        self._bind_ip = _wildcard(family) if self._multi else self._ip
        self._connect_ip = _loopback(family) if self._multi else self._ip
        self._node = node_id or _new_node_id()
        self._label = f"[{config.run_id} {self._node:016x}]"
        log.info(
            "%s mingle rendezvous: %s; interface %s (%s)",
            self._label,
            config.describe(),
            ", ".join(f"{i.name} {i.address}" for i in self._ifaces),
            why,
        )
        for warning in config.warnings():
            log.warning("%s %s", self._label, warning)
        timing = Timing.for_keep_alive(
            config.election_window, config.keep_alive_interval, config.keep_alive_max_attempt
        )
        secret = config.load_secret()
        if secret is None:
            _warn_unauthenticated_once(config)
        self._core = Discovery(
            config.run_id,
            self._node,
            timing=timing,
            codec=Codec(derive_key(secret) if secret is not None else None),
            addrs=tuple(i.address for i in self._ifaces) if self._multi else (self._ip,),
            wall_offset_s=time.time() - time.monotonic(),
        )
        broadcast = config.fallback == "broadcast"
        hosts = config.peer_hosts()
        self._driver = Driver(
            self._core,
            [
                McastTransport(i, config.group, config.port, config.ttl, broadcast=broadcast)
                for i in self._ifaces
            ],
            peers=PeerList(hosts, family, label=self._label) if hosts else None,
            on_become_leader=self._host,
            on_step_down=self._unhost,
            quiet_warning_s=config.discovery_warning,
            label=self._label,
        )
        self._host_lock = threading.Lock()
        self._leader_host: LeaderHost | None = None
        self._session: MemberSession | None = None
        self._liveness: LivenessClient | None = None
        self._trouble: str | None = None
        self._round: Round | None = None
        self._history: History | None = None
        self._closed = False
        self._shut = False
        self._user_env = {var: os.environ.get(var) for var in SOCKET_IFNAME_VARS}
        self._driver.start()

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> MingleRendezvousHandler:
        return cls(MingleConfig.from_params(params))

    # ------------------------------------------------------ RendezvousHandler API

    def get_backend(self) -> str:
        return BACKEND_NAME

    def get_run_id(self) -> str:
        return self._config.run_id

    @property
    def use_agent_store(self) -> bool:
        return True

    @property
    def node_id(self) -> int:
        return self._node

    @property
    def interface_name(self) -> str:
        return self._iface.name

    def next_rendezvous(self) -> RendezvousInfo:
        if self._shut:
            raise MingleClosedError(f"{self._label} this handler was shut down; create a new one")
        if self._closed:
            raise MingleClosedError(f"the rendezvous of job {self._config.run_id!r} is closed")
        started = time.monotonic()
        deadline = started + self._config.join_timeout
        generation = -1
        while True:
            found = self._driver.wait_leader(deadline, after_generation=generation)
            if found is None:
                raise self._timeout_error(started)
            leader, generation = found
            if leader.closed and not leader.is_self:
                self._job_closed(f"its leader at {leader.store_ip} finished it")
            try:
                session = self._ensure_session(leader, deadline)
                rnd = session.join(
                    ip=self._ip,
                    history=self._history,
                    deadline=deadline,
                    spare_wait_s=self._config.join_timeout,
                )
                info = self._round_info(rnd, session, leader)
            except LeaderUnreachable as exc:
                log.warning("%s leader %s unreachable: %s", self._label, leader.claim, exc)
                self._drop_session()
                self._driver.report_leader_failed(leader.claim, str(exc))
                continue
            except JoinAborted as exc:
                log.info("%s re-joining: %s", self._label, exc)
                self._drop_session()
                continue
            except JoinTimeout:
                raise self._timeout_error(started) from None
            except JoinClosed:
                self._job_closed("it was closed while this node waited")
            self._log_counters(rnd.number)
            log.info(
                "%s joined round %d as rank %d of %d (leader %s, store %s:%d) in %.3fs",
                self._label,
                rnd.number,
                info.rank,
                info.world_size,
                "this node" if leader.is_self else leader.store_ip,
                info.bootstrap_store_info.master_addr if info.bootstrap_store_info else "?",
                rnd.store_port,
                time.monotonic() - started,
            )
            return info

    def is_closed(self) -> bool:
        status = self._leader_status()
        if status is not None and status.closed:
            self._closed = True
        return self._closed

    def set_closed(self) -> None:
        self._closed = True
        self._tell_leader("close")

    def num_nodes_waiting(self) -> int:
        """Nodes waiting for a new round; > 0 also when this round cannot go on (the agent then re-joins).

        Answered from the status the leader pushes over the heartbeat connection: the agent
        polls this every monitor interval, and it must never block on a leader that hangs.
        """
        rnd = self._round
        if rnd is None or self._closed:
            return 0
        if self._trouble is not None or self._session is None:
            return 1
        status = self._leader_status()
        if status is None or status.epoch != rnd.epoch or status.round < rnd.number:
            return 0  # the status of our round is still on its way
        if status.closed:
            self._closed = True
            return 0
        if status.round > rnd.number or status.stale:
            return max(1, status.waiting)
        return status.waiting

    def shutdown(self) -> bool:
        if self._shut:
            return True
        self._shut = True
        self._closed = True
        with self._host_lock:
            leading = self._leader_host is not None
        if not leading:
            self._driver.stop(resign=False)  # a follower is done with discovery before it says goodbye
        # torch's contract: shutting down closes the rendezvous for every node (as c10d does).
        self._tell_leader("close", "leave")
        if self._liveness is not None:
            self._liveness.stop()
            self._liveness = None
        with self._host_lock:
            host = self._leader_host
            self._leader_host = None
        if host is not None:
            # The leader keeps its store up until every other node has left (their exit barriers).
            if not host.wait_all_gone(self._config.close_timeout):
                log.warning(
                    "%s stopping the store although not every node left within close_timeout=%gs",
                    self._label,
                    self._config.close_timeout,
                )
            self._driver.stop(resign=True)
            host.stop()
        elif leading:
            self._driver.stop(resign=False)
        self._session = None
        log.info("%s shut down", self._label)
        return True

    # --------------------------------------------------------------- internals

    def _job_closed(self, why: str) -> NoReturn:
        """The job is over. A node never admitted to it (a spare) has nothing to do: it exits 0."""
        self._closed = True
        if self._round is None:
            log.warning(
                "%s job %r finished before this node was admitted (%s); nothing to do, exiting",
                self._label,
                self._config.run_id,
                why,
            )
            # torch 2.13's launcher crashes on RendezvousGracefulExitError (agent.run() returns
            # None); SystemExit(0) ends torchrun cleanly, and shutdown() still runs on the way out.
            raise SystemExit(0)
        raise MingleClosedError(
            f"the rendezvous of job {self._config.run_id!r} is closed: {why}; "
            "use a new --rdzv_id for a new run"
        )

    def _tell_leader(self, *kinds: str) -> None:
        """Push events to the leader: through our own host's log if we lead, else our session."""
        with self._host_lock:
            host = self._leader_host
        try:
            for kind in kinds:
                if host is not None:
                    host.events.push({"t": kind, "node": node_hex(self._node)})
                elif self._session is not None:
                    self._session.push(kind)
        except (LeaderUnreachable, DistError, RuntimeError) as exc:
            log.info("%s could not tell the leader %s: %s", self._label, "/".join(kinds), exc)

    def _ensure_session(self, leader: LeaderView, deadline: float) -> MemberSession:
        session = self._session
        if session is not None and session.claim == leader.claim and self._trouble is None:
            return session
        self._drop_session()
        timeout = max(
            0.1, min(MAX_CONNECT_TIMEOUT_S, self._config.keep_alive_timeout, deadline - time.monotonic())
        )
        leader_ip = self._connect_ip if leader.is_self else leader.store_ip
        if not leader.is_self:
            self._settle(self._driver.heard_via(leader_ip), f"the leader {leader_ip} answered there")
        session = MemberSession(
            leader.claim,
            leader_ip,
            leader.store_port,
            node=self._node,
            timeout_s=timeout,
            op_timeout_s=max(MAX_CONNECT_TIMEOUT_S, self._config.keep_alive_timeout),
        )
        claim = leader.claim
        liveness = LivenessClient(
            leader_ip,
            session.liveness_port,
            node=self._node,
            epoch=claim.epoch,
            interval_s=self._config.keep_alive_interval,
            timeout_s=self._config.keep_alive_timeout,
            on_lost=lambda reason, evicted: self._liveness_lost(claim, reason, evicted),
            # The leader's heartbeats count as its announcements: lost multicast alone
            # (a flood, a busy switch) must not depose a leader that TCP still reaches.
            on_heartbeat=lambda: self._driver.report_leader_alive(claim),
            label=self._label,
        )
        try:
            liveness.start(timeout)
        except OSError as exc:
            raise LeaderUnreachable(f"cannot open the liveness channel to {leader_ip}: {exc}") from exc
        self._session, self._liveness, self._trouble = session, liveness, None
        self._driver.report_leader_alive(claim)
        return session

    def _settle(self, iface: Interface, why: str) -> None:
        """Use ``iface`` for this node's address and its workers' traffic (several interfaces only)."""
        if not self._multi or iface == self._iface:
            return
        self._iface = iface
        if not self._config.local_addr:
            self._ip = iface.address
        others = ", ".join(i.name for i in self._ifaces if i is not iface)
        log.info("%s interface %s (%s) chosen: %s; not %s", self._label, iface.name, self._ip, why, others)

    def _settle_as_leader(self, rnd: Round) -> None:
        """The leader faces its members: the interface whose subnet holds most of their addresses."""
        votes: dict[str, int] = {}
        for ip in rnd.ips[1:]:
            iface = interface_for(ip, self._ifaces)
            if iface is not None:
                votes[iface.name] = votes.get(iface.name, 0) + 1
        if votes:
            best = max(votes, key=lambda name: votes[name])
            chosen = next(i for i in self._ifaces if i.name == best)
            self._settle(chosen, f"{votes[best]} of the round's other members are on its subnet")

    def _log_counters(self, round_number: int) -> None:
        stats = self._driver.snapshot().stats
        log.debug(
            "%s round %d discovery counters: %d datagrams received, %d accepted, %d sent; dropped %s; "
            "other jobs %s",
            self._label,
            round_number,
            stats.received,
            stats.accepted,
            stats.sent,
            dict(stats.invalid) or "none",
            stats.other_jobs or "none",
        )

    def _leader_status(self) -> Status | None:
        liveness = self._liveness
        raw = liveness.status_json if liveness is not None else None
        return Status.decode(raw) if raw else None

    def _drop_session(self) -> None:
        if self._liveness is not None:
            self._liveness.stop()
        self._session = None
        self._liveness = None

    def _liveness_lost(self, claim: Claim, reason: str, evicted: bool) -> None:
        self._trouble = reason
        if evicted:
            log.warning("%s %s; re-joining", self._label, reason)
        else:
            log.warning("%s leader %s lost: %s", self._label, claim, reason)
            self._driver.report_leader_failed(claim, reason)

    def _round_info(self, rnd: Round, session: MemberSession, leader: LeaderView) -> RendezvousInfo:
        rank = rnd.rank_of(self._node)
        if rank is None:
            raise MingleStateError(
                f"{self._label} round {rnd.number} was reported to us but does not list us"
            )
        # The agent's own keys (rank assignment, exit barrier) live under a per-round prefix of
        # the connection we already hold; the workers get the round's fresh store (MASTER_PORT).
        store = session.agent_store(rnd.number)
        self._round = rnd
        self._history = History(epoch=rnd.epoch, round=rnd.number, members=rnd.members)
        if leader.is_self:
            self._settle_as_leader(rnd)
            master_addr = self._ip  # our address on the network our members are on
        else:
            master_addr = session.ip  # the leader's address that this node just reached
        self._export_worker_env()
        return RendezvousInfo(
            store,
            rank,
            rnd.world_size,
            RendezvousStoreInfo(master_addr=master_addr, master_port=rnd.store_port),
        )

    def _export_worker_env(self) -> None:
        for var in SOCKET_IFNAME_VARS:
            if self._user_env[var] is None:
                os.environ[var] = self._iface.name

    # ---------------------------------------------------------- leader's side

    def _host(self, epoch: int) -> tuple[str, int]:
        """Driver callback: we won the election; host the control store for this term."""
        claim = Claim(epoch=epoch, leader=self._node)
        book = RoundBook(
            leader=self._node,
            epoch=epoch,
            min_nodes=self._config.min_nodes,
            max_nodes=self._config.max_nodes,
            last_call_timeout=self._config.last_call_timeout,
        )
        host = LeaderHost(
            ip=self._bind_ip,
            connect_ip=self._connect_ip,
            claim=claim,
            book=book,
            keep_alive_interval_s=self._config.keep_alive_interval,
            keep_alive_timeout_s=self._config.keep_alive_timeout,
            on_status=self._status_changed,
            label=self._label,
        )
        with self._host_lock:
            old, self._leader_host = self._leader_host, host
        if old is not None:
            threading.Thread(target=old.stop, name="mingle-unhost", daemon=True).start()
        log.info(
            "%s this node leads job %r (epoch %d): store %s:%d",
            self._label,
            self._config.run_id,
            epoch,
            self._bind_ip,
            host.port,
        )
        return self._bind_ip, host.port

    def _unhost(self, claim: Claim) -> None:
        """Driver callback: a better claim won; stop hosting (off the driver thread)."""
        with self._host_lock:
            host, self._leader_host = self._leader_host, None
        if host is not None:
            self._trouble = f"this node stepped down as leader ({claim} lost)"
            threading.Thread(target=host.stop, name="mingle-unhost", daemon=True).start()

    def _status_changed(self, status: Status) -> None:
        cfg = self._config
        self._driver.call(
            lambda now: self._core.update_status(
                now,
                round=status.round,
                members=status.size,
                closed=status.closed,
                min_nodes=cfg.min_nodes,
                max_nodes=cfg.max_nodes,
            )
        )

    # -------------------------------------------------------------- messages

    def _auth_advice(self, invalid: Mapping[str, int]) -> str:
        """What dropped datagrams say about secrets and clocks, if anything."""
        tips = []
        if invalid.get("bad_tag"):
            tips.append(
                "datagrams signed with a different secret arrived: every node of the job needs the same "
                "secret (secret_file)"
            )
        if invalid.get("missing_tag"):
            tips.append(
                "unsigned datagrams arrived: some nodes run without a secret; give them the same secret_file"
            )
        if invalid.get("unexpected_tag"):
            tips.append(
                "signed datagrams arrived: the other nodes use a secret and this node has none; give it "
                f"the same secret_file (see {README_SECURITY})"
            )
        if invalid.get("outside_replay_window"):
            tips.append(
                f"signed datagrams older or newer than {REPLAY_WINDOW_MS // 1000} s arrived: if they are not "
                "replays, the nodes' clocks differ; sync them (NTP)"
            )
        return "; ".join(tips)

    def _timeout_error(self, started: float) -> MingleTimeoutError:
        cfg = self._config
        snap = self._driver.snapshot()
        waited = time.monotonic() - started
        ifaces = [self._iface] if not self._multi or self._round else self._ifaces
        names = ", ".join(f"{i.name} ({i.address})" for i in ifaces)
        where = f"interface {names}, group {cfg.group} port {cfg.port}"
        if snap.leader is None:
            situation = "no leader was found or elected"
        elif snap.leader.is_self:
            situation = f"this node leads ({snap.leader.claim})"
        else:
            situation = f"the leader is {snap.leader.store_ip} ({snap.leader.claim})"
        joined = ""
        if self._session is not None:
            try:
                st = self._session.status()
                joined = f"; {st.reason}"
            except (LeaderUnreachable, DistError):
                joined = ""
        others = ", ".join(f"{job!r} ({n})" for job, n in sorted(snap.stats.other_jobs.items()))
        heard = f"heard {snap.peers_heard} other node(s) of this job"
        if others:
            heard += f"; datagrams of other jobs: {others}"
        if snap.stats.dropped_total():
            heard += f"; {snap.stats.dropped_total()} invalid datagram(s) dropped {dict(snap.stats.invalid)}"
        auth = self._auth_advice(snap.stats.invalid)
        if auth:
            advice = auth
        elif snap.peers_heard == 0 and others:
            advice = (
                f"multicast works here but no node runs job {cfg.run_id!r}: start every node with the same "
                "--rdzv_id (and group/port)"
            )
        elif snap.peers_heard == 0:
            advice = (
                "nothing was heard on the group: start the other nodes, or multicast is blocked between "
                "the nodes, or they use another interface/group/port; see "
                f"{README_NETWORKS} for how to check that multicast reaches the peers"
            )
        else:
            advice = (
                f"fewer than min_nodes={cfg.min_nodes} nodes joined: start the missing ones or lower --nnodes"
            )
        return MingleTimeoutError(
            f"rendezvous of job {cfg.run_id!r} timed out after {waited:.1f}s "
            f"(join_timeout={cfg.join_timeout:g}s) on {where}: {situation}{joined}; {heard}. "
            f"What to try: {advice}"
        )
