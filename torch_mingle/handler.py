"""``MingleRendezvousHandler``: torch's ``RendezvousHandler`` contract on a mingle node.

Creating the handler picks the interfaces, opens the discovery sockets and starts the
node's loop (``_loop.py``), so the election overlaps torchrun's own set-up. Each method
below is a few lines around one request to the node, answered on the ``Board`` with a
deadline; none of them does network I/O on the agent's thread, except connecting the
agent's store to the round's TCPStore (which the node cuts loose if the leader is lost).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import itertools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from torch.distributed import DistError, TCPStore
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

from torch_mingle import BACKEND_NAME
from torch_mingle._advice import what_drops_mean
from torch_mingle._agent import (
    STORE_CONNECT_ATTEMPTS,
    Answered,
    AskJoin,
    Began,
    BreakSeen,
    CheckHealth,
    ConnectStore,
    Deliver,
    Event,
    ExitClean,
    Fail,
    Failure,
    HealthChecked,
    JoinFlow,
    Probed,
    ProbePeers,
    StoreFailed,
    StoreOpened,
    TellStoreUnreachable,
    Told,
    WatchBreak,
    nodes_waiting,
)
from torch_mingle._assembly import MAX_CONNECT_TIMEOUT_S, assemble
from torch_mingle._datapath import MingleDataPathError, failure_message, probe
from torch_mingle._events import record_notes
from torch_mingle._health import HEALTH_RETRY_S, Verdict, wait_until_healthy
from torch_mingle._interfaces import Interface, interface_for
from torch_mingle._notes import Note
from torch_mingle._ready import (
    ArriveRequested,
    CloseRequested,
    HealthChecking,
    HealthJudged,
    Input,
    JoinRequested,
    LeaveRequested,
    ShutdownRequested,
    StoreUnreachable,
    Ticket,
)
from torch_mingle._record import assert_never
from torch_mingle._records import History, JobEnd, Round
from torch_mingle._store import AgentStore, open_client
from torch_mingle._view import Diagnostics, Joined
from torch_mingle._wire import parse_ip
from torch_mingle.config import MingleConfig
from torch_mingle.errors import (
    README_NETWORKS,
    MingleClosedError,
    MingleConfigError,
    MingleError,
    MingleStateError,
    MingleTimeoutError,
)

log = logging.getLogger(__name__)

#: Set for the workers (to the discovery interface) unless the user set them.
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
#: Set for the workers of every round (docs/design.md#fencing): the leader's term and the round. Both
#: only grow within a job, so (epoch, round) orders the rounds, across failovers too.
EPOCH_VAR, ROUND_VAR = "MINGLE_EPOCH", "MINGLE_ROUND"
#: How much longer than the node's own deadline the agent's thread waits for an answer.
ANSWER_GRACE_S = 10.0
#: The most a preempted node (SIGTERM) waits for the others to go on without it before its
#: workers stop (Kubernetes' default grace period is 30 s, then SIGKILL).
MAX_LEAVE_WAIT_S = 15.0
#: A join not answered within this long loads what torch's agent needs after the rendezvous.
PRELOAD_AFTER_S = 0.05
#: torchrun's default ``--monitor-interval``: how often its agent polls ``num_nodes_waiting()``,
#: until this handler has timed two polls of its own.
DEFAULT_POLL_INTERVAL_S = 0.1
#: The longest a poll is held for the others (``_hold_for_the_others``): polls further apart
#: than this cannot be brought together without holding the agent too long.
MAX_POLL_HOLD_S = 5.0


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


_warned_endpoint = False


def _warn_endpoint_unused_once(config: MingleConfig) -> None:
    """An endpoint is ignored (launchers such as accelerate and TorchX pass one anyway): say so once."""
    global _warned_endpoint  # noqa: PLW0603 - once per process
    if not config.endpoint or _warned_endpoint:
        return
    _warned_endpoint = True
    log.warning(
        "--rdzv_endpoint %r is not used by the mingle backend: nodes find each other by multicast and "
        "the store runs on the node that gets rank 0; leave it out (some launchers pass one anyway, "
        "which is harmless)",
        config.endpoint,
    )


def _load_idna_codec() -> None:
    """Load, while a join waits, the codec torch's agent needs right after ``next_rendezvous()``.

    torch's agent records an event when ``next_rendezvous()`` returns, with this host's name
    (``socket.getfqdn``), and a process's first name lookup imports Python's IDNA codec:
    about 3 ms of CPU. torch's own backends look a name up in their handlers; mingle never
    does (it publishes addresses), so the agent would pay it just as the round forms, and
    on a host shared by several agents (the demo, the tests, the benchmark) those that left
    first would take that CPU from those still joining. A join that waits longer than
    ``PRELOAD_AFTER_S`` loads it meanwhile; the last node of a round, which waits no longer,
    keeps paying it after it leaves, when nobody waits for it.
    """
    codecs.lookup("idna")


_ticket_ids = itertools.count(1)


class MingleRendezvousHandler(RendezvousHandler):
    """The ``mingle`` backend: no endpoint, no MASTER_ADDR; rank 0 is found by multicast."""

    def __init__(self, config: MingleConfig, *, node_id: int | None = None) -> None:
        _log_to_stderr_if_asked()
        _warn_endpoint_unused_once(config)
        self._config = config
        built = assemble(config, node_id=node_id)
        self._ifaces, self._iface, self._multi = built.ifaces, built.ifaces[0], built.multi
        self._ip, self._connect_ip = built.ip, built.connect_ip
        self._identity, self._node_id, self._label = built.identity, built.identity.node_id, built.label
        self._probe, self._loop, self._board, self._node = built.probe, built.loop, built.board, built.node
        self._round: Round | None = None
        self._polled_at: float | None = None  # the agent's last num_nodes_waiting(), monotonic
        self._poll_interval = DEFAULT_POLL_INTERVAL_S
        self._closed = False
        self._shut = False
        self._failure: str | None = None
        #: Its health check never passed within ``join_timeout``: it leaves, not closes.
        self._unhealthy = False
        self._user_env = {var: os.environ.get(var) for var in SOCKET_IFNAME_VARS}
        self._sigterm_hook = self._on_sigterm  # one bound method: the handler we install, by identity
        self._sigterm_prev: Any = None
        self._left = False
        #: What the join flow's actions leave for the next one (``_next_rendezvous``).
        self._client: TCPStore | None = None
        self._master_addr = self._store_ip = self._ip
        self._health_output = ""
        self._data_path_failure = ""
        self._loop.start(self._node, self._board)

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> MingleRendezvousHandler:
        try:
            return cls(MingleConfig.from_params(params))
        except MingleConfigError as exc:
            # torch's launcher prints a long traceback before the message: say it first.
            log.error("mingle rendezvous refused its settings: %s", exc)  # noqa: TRY400 - no traceback: torch prints one
            raise

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
        return self._node_id

    @property
    def interface_name(self) -> str:
        return self._iface.name

    def diagnostics(self) -> Diagnostics:
        """A snapshot of this node: role, leader, round, rank, counters (for tests and tools)."""
        return self._board.diagnostics()

    def wait_diagnostics(
        self, predicate: Callable[[Diagnostics], bool], timeout_s: float
    ) -> Diagnostics | None:
        """Block until this node's snapshot satisfies ``predicate`` (None after ``timeout_s``)."""
        return self._board.wait_for(predicate, timeout_s)

    def next_rendezvous(self) -> RendezvousInfo:
        self._note(Note("join", "attempts to join the next round of the rendezvous"))
        try:
            info = self._next_rendezvous()
        except Exception as exc:
            self._note(Note("join_failed", f"failed to join: {type(exc).__name__}: {exc}", "FAILED"))
            raise
        store = info.bootstrap_store_info
        self._note(
            Note(
                "joined",
                f"joined round {self._round.number if self._round else '?'} of the rendezvous as rank "
                f"{info.rank} in a world of size {info.world_size}",
                rank=info.rank,
                master_endpoint=f"{store.master_addr}:{store.master_port}" if store else "",
            )
        )
        return info

    def _next_rendezvous(self) -> RendezvousInfo:
        """Carry out the join flow's actions (``_agent.JoinFlow``: what each outcome means and
        what comes next is decided there, for the simulator's agents too) until it delivers."""
        cfg = self._config
        flow = JoinFlow(
            self._node_id,
            cfg.run_id,
            join_timeout_s=cfg.join_timeout,
            store_timeout_s=min(MAX_CONNECT_TIMEOUT_S, cfg.keep_alive_timeout),
            health_check=cfg.health_check is not None,
            had_round=self._round is not None,
        )
        started = time.monotonic()
        event: Event = Began(self._shut, self._closed, self._job_failure() if self._closed else "")
        joined: Joined | None = None
        lost: MingleStateError | None = None  # the board's error, raised as it came
        while True:
            action = flow.step(event, time.monotonic())
            match action:
                case CheckHealth(until=until):
                    event = self._check_health(until)
                case AskJoin(timeout_s=left):
                    self._client = None  # a client of a round this node no longer goes on with
                    if self._probe is not None:
                        # What the last round's probes left in the queue goes now, while the join
                        # waits, not when the round has formed and every node probes at once.
                        self._probe.drain()
                    try:
                        outcome = self._ask("join", left, JoinRequested, while_waiting=_load_idna_codec)
                    except MingleStateError as exc:
                        lost, event = exc, Answered(None, error=str(exc))
                        continue
                    joined = outcome if isinstance(outcome, Joined) else None
                    if joined is not None:
                        self._face(joined)
                    event = Answered(outcome)
                case ConnectStore(attempt=attempt, timeout_s=timeout_s):
                    assert joined is not None  # noqa: S101 - the flow connects a joined round's store
                    if attempt > 1 and isinstance(event, StoreFailed):
                        log.warning(
                            "%s %s (try %d of %d); the leader still answers, trying again",
                            self._label, event.why.splitlines()[0], attempt - 1, STORE_CONNECT_ATTEMPTS,
                        )  # fmt: skip
                    event = self._connect_round_store(joined, timeout_s)
                case TellStoreUnreachable(claim=claim, why=why):
                    log.warning("%s %s; joining again", self._label, why)
                    self._loop.ask(StoreUnreachable(claim, why))
                    event = Told()
                case ProbePeers(rank=rank, peers=peers):
                    assert joined is not None  # noqa: S101 - the flow probes a joined round's peers
                    event = Probed(self._data_path_ok(joined, rank, peers), self._job_failure())
                case WatchBreak(key=key, grace_s=grace_s):
                    seen = self._board.wait_for(functools.partial(Diagnostics.round_broke, key=key), grace_s)
                    now = self._board.diagnostics()
                    event = BreakSeen(seen is not None, now.failure, closed=now.closed)
                    if event.broke and not event.failure:
                        log.warning(
                            "%s %s, but round %d broke meanwhile; joining again",
                            self._label,
                            self._data_path_failure.split(":")[0],
                            joined.round.number if joined else 0,
                        )
                case Deliver(joined=joined, rank=rank, world_size=world_size):
                    return self._deliver(joined, rank, world_size, started)
                case Fail(kind=kind, why=why, close=close):
                    self._client = None
                    if kind is Failure.STATE and lost is not None:
                        raise lost  # the board's own error: the loop stopped, or missed its deadline
                    self._fail(kind, why, close, started)
                case ExitClean(why=why):
                    self._closed = True
                    log.warning("%s %s", self._label, why)
                    # torch 2.13's launcher crashes on RendezvousGracefulExitError (agent.run()
                    # returns None); SystemExit(0) ends torchrun cleanly, and shutdown() still
                    # runs on the way out.
                    raise SystemExit(0)
                case _:
                    assert_never(action)

    def _fail(self, kind: Failure, why: str, close: bool, started: float) -> NoReturn:
        """Raise the error of a failed ``next_rendezvous()`` (``Fail``)."""
        if kind is Failure.SHUT:
            raise MingleClosedError(f"{self._label} {why}")
        if kind is Failure.TIMEOUT:
            self._failure = f"its rendezvous timed out: {why}"
            raise self._timeout_error(started, why)
        if kind is Failure.HEALTH:
            cfg = self._config
            self._failure = f"its health check failed: {why}"
            self._unhealthy = True
            raise MingleTimeoutError(
                f"{self._label} this node's health check `{cfg.health_check}` kept failing for "
                f"join_timeout={cfg.join_timeout:g}s, so it did not join: {why}. Its last "
                f"output:\n{self._health_output or '(none)'}\nFix the node, or the check "
                "(docs/usage.md#health-checks)"
            )
        if kind is Failure.DATA_PATH:
            why = self._data_path_failure
            log.error("%s %s", self._label, why)
            self._failure = why
            if close:
                self._loop.ask(CloseRequested(JobEnd(why, stops_round=True, failed=True)))
            raise MingleDataPathError(f"{self._label} {why}")
        if kind is Failure.STATE:
            raise MingleStateError(f"{self._label} {why}")
        if kind is Failure.CONFIG:
            self._failure = why
            raise MingleConfigError(f"{self._label} {why}")
        self._closed = True
        raise MingleClosedError(f"{self._label} {why}")

    def _check_health(self, until: float) -> HealthChecked:
        """Run the site's check before the join; while it fails, this node stays out of the
        rounds and leads none. Bounded by ``until`` (the end of ``join_timeout``)."""
        cfg = self._config
        assert cfg.health_check is not None  # noqa: S101 - called with one

        def failed(verdict: Verdict) -> None:
            log.warning(
                "%s health check `%s` failed: %s; this node stays out of the job and tries again "
                "in %gs\n%s",
                self._label, cfg.health_check, verdict.why, HEALTH_RETRY_S, verdict.output,
            )  # fmt: skip
            self._note(Note("health_check_failed", f"failed its health check: {verdict.why}", "FAILED"))
            self._loop.ask(HealthJudged(unfit=True))

        self._loop.ask(HealthChecking(running=True))
        try:
            verdict = wait_until_healthy(cfg.health_check, cfg.health_check_timeout, until, on_failure=failed)
        finally:
            self._loop.ask(HealthChecking(running=False))
        self._loop.ask(HealthJudged(unfit=not verdict.ok))
        self._health_output = verdict.output
        return HealthChecked(verdict.ok, verdict.why, shut=self._shut)

    def is_closed(self) -> bool:
        if self._board.diagnostics().closed:
            self._closed = True
        return self._closed

    def set_closed(self) -> None:
        self._note(Note("set_closed", "marked the rendezvous as closed (set_closed)", "SUCCEEDED"))
        self._closed = True
        self._loop.ask(CloseRequested(JobEnd("set_closed()")))

    def num_nodes_waiting(self) -> int:
        """Nodes waiting for a new round; > 0 also when this round cannot go on (the agent then re-joins).

        Read from the node's last snapshot: the agent polls this every monitor interval, and
        it must never wait on a leader that hangs. The first poll after the leader said the
        round will change is held, locally and briefly, for the other members' agents
        (``_hold_for_the_others``).
        """
        self._time_poll()
        notes = self._board.take_notes()
        if notes:
            self._record_notes(notes)
        if self._round is None:
            return 0
        diag = self._board.diagnostics()
        waiting = nodes_waiting(History.of(self._round).key, self._closed, diag)
        if not self._closed or diag.failure:
            self._hook_preemption()  # (a job that finished: its workers finish, no leave to put first)
        if waiting > 0 and diag.told_at is not None:
            self._hold_for_the_others(diag.told_at)
        return waiting

    def _time_poll(self) -> None:
        """Learn how often the agent polls (its ``--monitor-interval``, plus its own work)."""
        now = time.monotonic()
        if self._polled_at is not None and 0 < now - self._polled_at <= MAX_POLL_HOLD_S:
            self._poll_interval = now - self._polled_at
        self._polled_at = now

    def _hold_for_the_others(self, told_at: float) -> None:
        """Return from the first poll after a change only at a time common to every member.

        torch's agents poll on their own clocks, up to a monitor interval apart: the first to
        see the change stops its workers, and a member whose agent has not polled yet sees its
        worker fail first, which uses one of its ``--max-restarts`` (or ends the job at 0).
        Every member was told within milliseconds (``Diagnostics.told_at``), so each holds its
        poll until that moment plus a little more than a poll interval: by then every agent is
        inside this call, and all stop their workers together. The workers run meanwhile.
        """
        window = min(MAX_POLL_HOLD_S, 1.5 * self._poll_interval + 0.05)
        hold = told_at + window - time.monotonic()
        if hold > 0:
            time.sleep(hold)

    def shutdown(self) -> bool:
        if self._shut:
            return True
        self._shut = True
        self._closed = True
        # torch's contract: shutting down closes the rendezvous for every node (as c10d does).
        # A leader keeps its stores up until every other node has left (their exit barriers).
        close_timeout = self._config.close_timeout
        failure = self._failure or _failure_on_the_way_out()
        why = f"it shut down after: {failure}" if failure else "it finished"
        if self._unhealthy:
            # Its health check never passed: this node leaves, and the job goes on without it
            # (closing the rendezvous would end it for every node).
            self.leave()
        else:
            with contextlib.suppress(MingleError):
                self._ask(
                    "shutdown",
                    close_timeout,
                    lambda t: ShutdownRequested(t, close_timeout, JobEnd(why, failed=bool(failure))),
                )
        self._note(Note("shutdown", "closed the rendezvous", "SUCCEEDED"))
        self._loop.stop()
        if self._probe is not None:
            self._probe.close()
        self._identity.release(forget=True)  # it ended gracefully: no vote left to keep
        log.info("%s shut down", self._label)
        return True

    # --------------------------------------------------------------- preemption

    def _hook_preemption(self) -> None:
        """Put a graceful leave in front of torch's SIGTERM handler.

        torch's agent installs its handler when it starts the workers, and on the signal it
        stops them and exits without calling ``shutdown()``. The agent polls
        ``num_nodes_waiting()`` on its main thread while the workers run: there we wrap torch's
        handler (only torch's: nothing else in the process is touched), once per install.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is self._sigterm_hook or not getattr(current, "__module__", "").startswith(
            "torch.distributed.elastic"
        ):
            return
        self._sigterm_prev = current
        signal.signal(signal.SIGTERM, self._sigterm_hook)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        prev = self._sigterm_prev
        signal.signal(signal.SIGTERM, prev)  # a second SIGTERM goes straight to torch
        if not self._left and not self._shut:
            self._left = True
            log.warning("%s SIGTERM: leaving the job", self._label)
            self.leave()
        prev(signum, frame)  # torch's: stops the workers, the agent exits

    def leave(self) -> None:
        """Leave the job now, the others going on without this node (a preemption notice).

        Returns once the others no longer need this node's workers (bounded by
        ``close_timeout``, at most ``MAX_LEAVE_WAIT_S``): stopped earlier, they would make the
        others' workers fail, which counts against their ``--max-restarts``.
        """
        wait_s = min(self._config.close_timeout, MAX_LEAVE_WAIT_S)
        log.warning("%s leaving: the others go on without this node", self._label)
        started = time.monotonic()
        try:
            went_on = self._ask("leave", wait_s, LeaveRequested)
        except MingleError as exc:
            log.warning("%s left without waiting for the others: %s", self._label, exc)
        else:
            took = time.monotonic() - started
            if went_on:
                log.info("%s left the job; the others went on after %.2fs", self._label, took)
            else:
                log.warning("%s left the job after %.2fs without seeing the others go on", self._label, took)
        self._closed = True
        self._identity.release(forget=True)  # it left: its vote went with it

    # --------------------------------------------------------------- internals

    def _ask(
        self,
        kind: str,
        timeout_s: float,
        request: Callable[[Ticket], Input],
        *,
        while_waiting: Callable[[], None] | None = None,
    ) -> object:
        """Hand the node ``request(ticket)`` and wait for its answer (bounded: see ``Board.wait``).

        ``while_waiting``: work for the agent's thread if no answer came within ``PRELOAD_AFTER_S``.
        """
        ticket = Ticket(kind, next(_ticket_ids), timeout_s=max(0.001, timeout_s))
        ticket.deadline = time.monotonic() + ticket.timeout_s
        self._loop.ask(request(ticket))
        if while_waiting is not None and not self._board.answered_within(ticket, PRELOAD_AFTER_S):
            while_waiting()
        return self._board.wait(ticket, grace_s=ANSWER_GRACE_S, on_notes=self._record_notes)

    def _note(self, note: Note) -> None:
        """Record a rendezvous event of the agent's thread, after those the loop posted."""
        self._record_notes([*self._board.take_notes(), note])

    def _record_notes(self, notes: list[Note]) -> None:
        record_notes(notes, self._config.run_id, f"{self._node_id:016x}")

    def _arrive_at_exit_barrier(self, round_number: int) -> None:
        """torch's agent enters the exit barrier: tell the leader first (bounded wait)."""
        timeout = min(MAX_CONNECT_TIMEOUT_S, self._config.keep_alive_timeout)
        with contextlib.suppress(MingleError):
            self._ask("arrive", timeout, lambda t: ArriveRequested(t, round_number))

    def _face(self, joined: Joined) -> None:
        """Where this node meets its round: the interface its workers use, and the store's address."""
        if joined.leader_ip is None:
            self._settle_as_leader(joined.round)
            self._master_addr, self._store_ip = self._ip, self._connect_ip  # ours, on our members' network
        else:
            self._settle(
                self._loop.interface_towards(joined.leader_ip),
                f"the leader {joined.leader_ip} answered there",
            )
            self._master_addr = self._store_ip = joined.leader_ip  # the leader's address this node reached

    def _connect_round_store(self, joined: Joined, timeout_s: float) -> StoreOpened | StoreFailed:
        """A client of the round's store (``ConnectStore``), bounded by ``timeout_s``. torch's
        client resolves the store's address back to a name before it connects, and a resolver
        that is slow or unreachable costs its own timeout (5 s by default) per try: the flow
        gives each try longer. A frozen leader ends the try at once (the node cuts its
        sockets, see ``abort_connections_to``) and is then no longer the leader."""
        port = joined.round.store_port
        try:
            self._client = open_client(self._store_ip, port, timeout_s, ended=self._loop.ended_stores)
        except DistError as exc:
            broke = self._board.diagnostics().round_broke(History.of(joined.round).key)
            where = joined.leader_ip or "this node"
            return StoreFailed(f"the round's store at {where}:{port} failed: {exc}", broke)
        return StoreOpened()

    def _deliver(self, joined: Joined, rank: int, world_size: int, started: float) -> RendezvousInfo:
        """The workers start in the joined round (``Deliver``): the agent's store and its rendezvous info."""
        rnd = joined.round
        client = joined.client if isinstance(joined.client, TCPStore) else self._client
        if client is None:
            raise MingleStateError(f"{self._label} round {rnd.number} delivered without a store client")
        if client is joined.client:
            log.debug("%s round %d: the store client was connected ahead", self._label, rnd.number)
        self._client = None
        key = History.of(rnd).key
        store = AgentStore(
            client,
            on_barrier=lambda: self._arrive_at_exit_barrier(rnd.number),
            failed=self._job_failure,
            round_broke=lambda: self._board.diagnostics().round_broke(key),
            world_size=world_size,
            wait_broken=lambda timeout_s: (
                self._board.wait_for(
                    functools.partial(Diagnostics.round_broke, key=key), timeout_s, running=True
                )
                is not None
            ),
            heartbeat_timeout_s=self._config.keep_alive_timeout,
        )
        self._round, self._polled_at = rnd, None  # polls are timed within a round
        self._export_worker_env(rnd)
        log.info(
            "%s joined round %d as rank %d of %d (leader %s, store %s:%d) in %.3fs",
            self._label,
            rnd.number,
            rank,
            world_size,
            "this node" if joined.leader_ip is None else joined.leader_ip,
            self._master_addr,
            rnd.store_port,
            time.monotonic() - started,
        )
        self._log_counters(rnd.number)
        return RendezvousInfo(
            store,
            rank,
            world_size,
            RendezvousStoreInfo(master_addr=self._master_addr, master_port=rnd.store_port),
        )

    def _job_failure(self) -> str:
        """Why the job failed ("" while it did not): a member's round could not start."""
        return self._board.diagnostics().failure

    def _data_path_ok(self, joined: Joined, rank: int, peers: tuple[int, ...]) -> bool:
        """Before the workers start: can this node open a TCP connection to its peers, on the
        addresses its workers and theirs will use? If not (``_data_path_failure`` says how),
        the flow looks whether the round broke meanwhile (a peer that died or left), and
        otherwise fails the job on every node with the pairs named (``_datapath``), instead
        of a process group that hangs."""
        rnd, timeout = joined.round, self._config.data_path_timeout
        if self._probe is None or not len(rnd.pports) == len(rnd.ips) == rnd.world_size:
            return True
        targets = []
        for peer in peers:
            ip, port = rnd.ips[peer], rnd.pports[peer]
            with contextlib.suppress(ValueError):  # a leader on several networks advertises none
                if parse_ip(ip).is_unspecified:
                    ip = joined.leader_ip or self._ip
            if port:
                targets.append((peer, ip, port))
        failed, local = probe(targets, timeout, scope=self._iface.name)
        for u in local:
            log.warning("%s data path check: rank %d at %s not probed: %s", self._label, u.rank, u.ip, u.why)
        if failed:
            self._data_path_failure = failure_message(
                (rank, rnd.ips[rank]), self._iface.name, failed, len(targets), timeout
            )
        return not failed

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

    def _export_worker_env(self, rnd: Round) -> None:
        """What the agent's workers inherit: the interface (unless the user set it) and the round."""
        for var in SOCKET_IFNAME_VARS:
            if self._user_env[var] is None:
                os.environ[var] = self._iface.name
        os.environ[EPOCH_VAR] = str(rnd.epoch)
        os.environ[ROUND_VAR] = str(rnd.number)

    def _log_counters(self, round_number: int) -> None:
        stats = self._board.diagnostics().stats
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

    # -------------------------------------------------------------- messages

    def _timeout_error(self, started: float, why: str) -> MingleTimeoutError:
        cfg = self._config
        diag = self._board.diagnostics()
        waited = time.monotonic() - started
        ifaces = [self._iface] if not self._multi or self._round else self._ifaces
        names = ", ".join(f"{i.name} ({i.address})" for i in ifaces)
        where = f"interface {names}, group {cfg.group} port {cfg.port}"
        stats = diag.stats
        others = ", ".join(f"{job!r} ({n})" for job, n in sorted(stats.other_jobs.items()))
        heard = f"heard {diag.peers_heard} other node(s) of this job"
        if others:
            heard += f"; datagrams of other jobs: {others}"
        if stats.dropped_total():
            heard += f"; {stats.dropped_total()} invalid datagram(s) dropped {dict(stats.invalid)}"
        auth = what_drops_mean(stats.invalid)
        if auth:
            advice = auth
        elif diag.peers_heard == 0 and others:
            advice = (
                f"multicast works here but no node runs job {cfg.run_id!r}: start every node with the same "
                "--rdzv_id (and group/port)"
            )
        elif diag.peers_heard == 0:
            advice = (
                "nothing was heard on the group: start the other nodes, or multicast is blocked between "
                "the nodes, or they use another interface/group/port; see "
                f"{README_NETWORKS} for how to check that multicast reaches the peers"
            )
        else:
            advice = (
                f"fewer than min_nodes={cfg.min_nodes} nodes joined: start the missing ones (or replace "
                "the lost ones), or lower --nnodes"
            )
        return MingleTimeoutError(
            f"rendezvous of job {cfg.run_id!r} timed out after {waited:.1f}s "
            f"(join_timeout={cfg.join_timeout:g}s) on {where}: {why}; {heard}. What to try: {advice}"
        )


def _failure_on_the_way_out() -> str:
    """Why this agent fails, when torch's launcher calls ``shutdown()`` on the way out of a
    failure ("" otherwise): it calls it from a ``finally`` clause (torch 2.5-2.13
    ``launch_agent``), so the exception that ends the agent is still being raised: the workers'
    failure (``ChildFailedError``) or the rendezvous'. A clean finish has none. (A program of
    its own that calls ``shutdown()`` from inside an ``except`` block is taken as failing.)"""
    exc = sys.exc_info()[1]
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return ""
    if isinstance(exc, ChildFailedError):
        return "its workers failed"
    first = str(exc).strip().splitlines()
    return f"its agent failed: {type(exc).__name__}" + (f": {first[0][:300]}" if first else "")
