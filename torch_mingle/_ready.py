"""A node's one input and one output: what a shell hands in (``Input``) and what the node
decided to do (``Ready``), as etcd's raft has its messages and its ``Ready``.

How it works
------------
A shell (the loop of real sockets, ``_loop``; the simulator, ``testing.sim``) collects what
happened (a datagram, a connection accepted, frames, a close and what it proves, a finished
job, a timer, a request of the agent) and calls ``Node.step(inputs, now)``. The node answers
with one ``Ready``: the state to write, the datagrams and stream operations in the order it
decided them, the jobs for the background thread, the answers and snapshots for the agent's
thread, its rendezvous notes, the connections of the agent to cut, and when to call it again.
``apply`` carries a ``Ready`` out, always in the same order:

1. ``state`` first. Every change of the node's vote or of what it must not forget is in it
   (``_ballot``), and nothing of the ``Ready`` leaves the node before it is on the disk: the
   rule "persist before you send" is data, as etcd's ``MustSync``. A write that the disk
   refuses stops the node (``StateNotRecorded``), and nothing of that ``Ready`` goes out: a
   node that cannot keep its word gives none.
2. ``net``: datagrams, listens, connects, sends and closes, in the order decided.
3. ``jobs``, then ``answers`` (snapshots and the agent's answers, in order: an answer after
   the snapshot that shows it) and ``notes``, then ``cuts`` (an agent woken by a cut reads
   its round's trouble in the snapshot published before).

What the node used to ask the shell for and branch on comes back as an input of its own: a
listening port (``Listening``, ``ListenRefused``), a connect that failed at once (a
``ConnectionClosed``). The ids of the connections a node opens are its own (``Connect.conn``,
negative); the shell numbers those it accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch_mingle._ballot import NodeState
from torch_mingle._claims import Claim, Dest
from torch_mingle._errors import StateError
from torch_mingle._evidence import Evidence
from torch_mingle._jobs import Job
from torch_mingle._notes import Note
from torch_mingle._record import field, record
from torch_mingle._records import JobEnd
from torch_mingle._view import Diagnostics
from torch_mingle._wire import Framed, Invalid

# ------------------------------------------------------------------ inputs: what happened


@record
class Started:
    """The shell runs: the election begins."""


@record
class DatagramReceived:
    data: bytes
    addr: Dest


@record
class ConnectionAccepted:
    """A connection to the leader's control port, from ``source`` (an address)."""

    conn: int
    source: str = ""


@record
class Connected:
    """A connection this node opened (``Connect``) is up."""

    conn: int


@record
class FramesReceived:
    conn: int
    frames: list[Framed] | Invalid


@record
class ConnectionClosed:
    """A connection ended; ``evidence``: what the transport saw (``_evidence.judge`` decides)."""

    conn: int
    reason: str
    evidence: Evidence


@record
class WorkDone:
    """A job of the background thread finished (``result``, or ``error``)."""

    job: Job
    tag: int
    result: object = None
    error: str | None = None


@record
class TimerFired:
    """The time ``Ready.timer`` asked for came."""


@record
class Listening:
    """The control port a ``Listen`` asked for is open."""

    port: int


@record
class ListenRefused:
    why: str


@record
class CodeFailed:
    """The node's own code raised while it stepped (a bug): a leader resigns, a follower joins
    again (``Node.step`` then hands in the inputs that came after the one that failed)."""

    exc: BaseException


# ------------------------------------------------------------------ inputs: the agent's requests


@record
class JoinRequested:
    """``next_rendezvous``: a place in the next round."""

    ticket: Ticket


@record
class ArriveRequested:
    """The agent enters torch's exit barrier of round ``round_number``."""

    ticket: Ticket
    round_number: int


@record
class CloseRequested:
    """``set_closed()``, or a round of this node that cannot start (``JobEnd.stops_round``)."""

    end: JobEnd


@record
class ShutdownRequested:
    """``shutdown()``: close the job (``end``: failed, if this agent failed) and leave."""

    ticket: Ticket
    close_timeout_s: float
    end: JobEnd


@record
class LeaveRequested:
    """A preemption notice: leave at once, the job going on without this node."""

    ticket: Ticket


@record
class HealthChecking:
    """The node's health check started (``running``) or ended."""

    running: bool


@record
class HealthJudged:
    """The node's health check failed (``unfit``) or passed."""

    unfit: bool


@record
class StoreUnreachable:
    """The agent could not reach the round's store of ``claim``'s leader."""

    claim: Claim
    why: str


#: What happens on a connection: the role that holds it takes it (``Node._role_step``).
ConnectionInput = ConnectionAccepted | Connected | FramesReceived | ConnectionClosed

Input = (
    Started
    | DatagramReceived
    | ConnectionAccepted
    | Connected
    | FramesReceived
    | ConnectionClosed
    | WorkDone
    | TimerFired
    | Listening
    | ListenRefused
    | CodeFailed
    | JoinRequested
    | ArriveRequested
    | CloseRequested
    | ShutdownRequested
    | LeaveRequested
    | HealthChecking
    | HealthJudged
    | StoreUnreachable
)


# ------------------------------------------------------------------ the agent's tickets


@record(frozen=False)
class Ticket:
    """A request from the agent's thread; the node answers it on the loop thread.

    ``done``, ``result``, ``error`` and ``deadline`` are the agent's side, written under the
    board's lock (``_board``); ``decided`` and ``due`` are the node's, which only the loop
    thread reads: the node decides at once, and the agent hears it once the ``Ready`` is
    applied."""

    kind: str
    id: int
    timeout_s: float = 0.0
    #: When the agent gives up waiting (its clock); None while parked behind a healthy round.
    deadline: float | None = None
    done: bool = False
    result: object = None
    error: BaseException | None = None
    #: The node answered it (its answer may not have reached the board yet).
    decided: bool = False
    #: When the node gives up on its own (loop clock); None while parked.
    due: float | None = None


# ------------------------------------------------------------------ output: what to do


@record
class SendDatagram:
    data: bytes
    dest: Dest


@record
class Listen:
    """Open the control port on ``ip`` (a previous one closes): ``Listening`` or ``ListenRefused``."""

    ip: str


@record
class StopListening:
    pass


@record
class Connect:
    """Open connection ``conn`` (the node's id for it) to ``ip:port``: ``Connected`` once up."""

    conn: int
    ip: str
    port: int


@record
class Send:
    conn: int
    data: bytes


@record
class Close:
    conn: int


NetOp = SendDatagram | Listen | StopListening | Connect | Send | Close


@record
class Publish:
    """A new snapshot of the node for the agent's thread."""

    diag: Diagnostics


@record
class Resolve:
    ticket: Ticket
    result: object = None
    error: BaseException | None = None


@record
class Extend:
    """The agent's wait for ``ticket`` ends at ``deadline`` now (None: parked)."""

    ticket: Ticket
    deadline: float | None


Answer = Publish | Resolve | Extend


@record
class Cut:
    """Cut the agent's connections to ``ip``'s ``ports`` (a lost leader's stores); ``ended``:
    for good (the agent's store then says why)."""

    ip: str
    ports: tuple[int, ...]
    ended: bool = False


@record(frozen=False)
class Ready:
    """Everything one step decided, carried out by ``apply`` in the order of its fields."""

    #: The node's state, to be on the disk before anything else of this ``Ready`` leaves.
    state: NodeState | None = None
    net: list[NetOp] = field(default_factory=list)
    jobs: list[tuple[Job, int]] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    #: When to step the node again with ``TimerFired`` (None: no timer).
    timer: float | None = None

    def __bool__(self) -> bool:
        return bool(
            self.state is not None or self.net or self.jobs or self.answers or self.notes or self.cuts
        )

    # What the node decides, as it decides it (one append each).

    def send_datagram(self, data: bytes, dest: Dest) -> None:
        self.net.append(SendDatagram(data, dest))

    def listen(self, ip: str) -> None:
        self.net.append(Listen(ip))

    def stop_listening(self) -> None:
        self.net.append(StopListening())

    def connect(self, conn: int, ip: str, port: int) -> None:
        self.net.append(Connect(conn, ip, port))

    def send(self, conn: int, data: bytes) -> None:
        self.net.append(Send(conn, data))

    def close(self, conn: int) -> None:
        self.net.append(Close(conn))

    def submit(self, job: Job, tag: int) -> None:
        self.jobs.append((job, tag))

    def abort_connections_to(self, ip: str, ports: Sequence[int], *, ended: bool = False) -> None:
        self.cuts.append(Cut(ip, tuple(ports), ended))

    def publish(self, diag: Diagnostics) -> None:
        self.answers.append(Publish(diag))


class StateNotRecorded(StateError):
    """The disk refused the node's state: nothing of that ``Ready`` went out, and the node stops."""


class Shell(Protocol):
    """What ``apply`` asks of a shell: the effects themselves, each one call."""

    def persist(self, state: NodeState) -> bool: ...
    def send_datagram(self, data: bytes, dest: Dest) -> None: ...
    def listen(self, ip: str) -> int: ...
    def stop_listening(self) -> None: ...
    def connect(self, conn: int, ip: str, port: int) -> None: ...
    def send(self, conn: int, data: bytes) -> None: ...
    def close(self, conn: int) -> None: ...
    def submit(self, job: Job, tag: int) -> None: ...
    def abort_connections_to(self, ip: str, ports: Sequence[int], *, ended: bool = False) -> None: ...


class Routes(Protocol):
    """What a node asks its shell about the network (lookups, not effects: those go in ``Ready``)."""

    def local_ip_towards(self, ip: str) -> str: ...
    def discovery_port_towards(self, ip: str) -> int: ...
    def describe(self) -> str: ...


class Answers(Protocol):
    """Where the agent's thread reads the node (``_board.Board``)."""

    def publish(self, diag: Diagnostics) -> None: ...
    def resolve(self, ticket: Ticket, result: object = None, error: BaseException | None = None) -> None: ...
    def extend(self, ticket: Ticket, deadline: float | None) -> None: ...
    def post_note(self, note: Note) -> None: ...


def apply(ready: Ready, shell: Shell, board: Answers) -> list[Input]:
    """Carry ``ready`` out (see the module doc); the inputs it produced, to step at once."""
    if ready.state is not None and not shell.persist(ready.state):
        raise StateNotRecorded(
            "the state directory refused this node's vote and could not be cleared either; nothing "
            "it decided went out, and it stops (see state_dir in docs/usage.md#configuration-in-detail)"
        )
    feedback: list[Input] = []
    for op in ready.net:
        match op:
            case SendDatagram(data=data, dest=dest):
                shell.send_datagram(data, dest)
            case Send(conn=conn, data=data):
                shell.send(conn, data)
            case Close(conn=conn):
                shell.close(conn)
            case Connect(conn=conn, ip=ip, port=port):
                try:
                    shell.connect(conn, ip, port)
                except OSError as exc:
                    feedback.append(
                        ConnectionClosed(conn, f"cannot connect to {ip}:{port}: {exc}", Evidence.REFUSED)
                    )
            case Listen(ip=ip):
                try:
                    feedback.append(Listening(shell.listen(ip)))
                except OSError as exc:
                    feedback.append(ListenRefused(f"listening on {ip} failed: {exc}"))
            case StopListening():
                shell.stop_listening()
    for job, tag in ready.jobs:
        shell.submit(job, tag)
    for answer in ready.answers:
        match answer:
            case Publish(diag=diag):
                board.publish(diag)
            case Resolve(ticket=ticket, result=result, error=error):
                board.resolve(ticket, result, error)
            case Extend(ticket=ticket, deadline=deadline):
                board.extend(ticket, deadline)
    for note in ready.notes:
        board.post_note(note)
    for cut in ready.cuts:
        shell.abort_connections_to(cut.ip, cut.ports, ended=cut.ended)
    return feedback
