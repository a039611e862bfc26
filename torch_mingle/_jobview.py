"""What ``torch-mingle status JOB`` shows of a job, as its leader sees it (pure).

The leader keeps a short chronicle of its rounds (``Chronicle``: who was lost and how it was
noticed, who left, which round formed with whom), and answers an observer's hello (a hello
with ``observe``, sealed like any other where the job has a secret) with ``job_view``: the
leader and its epoch, the round and every member with its node rank and address, the spares,
the nodes held back by ``rejoin_delay`` and until when, the members the next round waits for
and why, and the chronicle. Times are seconds before the answer, from the leader's clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from torch_mingle._ledger import Ledger
from torch_mingle._records import Round, Status, node_hex
from torch_mingle._settings import RoundRules

#: Lines of the chronicle a leader keeps (the last rounds' endings and beginnings).
MAX_STORY = 32


class Chronicle:
    """The last things that ended or began a round, each with when (the leader's clock)."""

    def __init__(self) -> None:
        self.lines: deque[tuple[float, str]] = deque(maxlen=MAX_STORY)

    def lost(self, rnd: Round | None, node: int, why: str, now: float) -> None:
        if rnd is not None and node in rnd.member_set:
            self.lines.append((now, f"round {rnd.number}: node {node_hex(node)} lost ({why})"))

    def left(self, rnd: Round | None, node: int, now: float) -> None:
        if rnd is not None and node in rnd.member_set:
            self.lines.append((now, f"round {rnd.number}: node {node_hex(node)} left the job"))

    def formed(self, rnd: Round, before: Round | None, now: float) -> None:
        came = [node_hex(n) for n in rnd.members if before is None or n not in before.member_set]
        went = [node_hex(n) for n in before.members if n not in rnd.member_set] if before else []
        said = f"round {rnd.number} formed, {rnd.world_size} node(s)"
        if before is not None:
            said += f" after round {before.number}: joined {', '.join(came) or 'none'}"
            said += f"; without {', '.join(went) or 'none'}"
        self.lines.append((now, said))


class Book(Protocol):
    """What the view reads of a leader's round book (``_rounds.RoundBook``)."""

    current: Round | None
    epoch: int
    rules: RoundRules
    ledger: Ledger
    ips: dict[int, str]
    formed_at: float
    chronicle: Chronicle

    @property
    def pending(self) -> Mapping[int, object]: ...
    @property
    def stale(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def status(self, now: float) -> Status: ...
    def held_until(self, now: float) -> dict[int, float]: ...
    def missing(self) -> list[int]: ...


def job_view(book: Book, leader: int, leader_ip: str, now: float) -> dict[str, Any]:
    """The job as ``book``'s leader sees it at ``now`` (JSON-ready)."""
    rnd = book.current
    lost = book.ledger.lost_why
    members = []
    if rnd is not None:
        for rank, node in enumerate(rnd.members):
            ip = rnd.ips[rank] if rank < len(rnd.ips) else book.ips.get(node, "")
            gone = lost.get(node, "lost") if node in book.ledger.lost else ""  # (why: kept from before)
            members.append({"rank": rank, "node": node_hex(node), "ip": ip, "lost": gone})
    held = book.held_until(now)
    state = _state(book)
    in_round = rnd.member_set if rnd is not None else frozenset()

    def who(node: int, **more: Any) -> dict[str, Any]:
        return {"node": node_hex(node), "ip": book.ips.get(node, ""), **more}

    return {
        "leader": node_hex(leader),
        "leader_ip": leader_ip,
        "epoch": book.epoch,
        "round": rnd.number if rnd is not None else 0,
        "world_size": rnd.world_size if rnd is not None else 0,
        "state": state,
        "reason": book.status(now).reason if state != "running" else "",
        "min_nodes": book.rules.min_nodes,
        "max_nodes": book.rules.max_nodes,
        "round_age_s": round(now - book.formed_at, 3) if rnd is not None else None,
        "members": members,
        "spares": [who(n) for n in book.pending if n not in in_round and n not in held],
        "held": [
            who(n, until_s=round(end - now, 3) if math.isfinite(end) else None)
            for n, end in sorted(held.items())
        ],
        # A running round's members re-join only when it restarts: none is missing then.
        "missing": [who(n, why=lost.get(n, "not re-joined")) for n in book.missing()]
        if state != "running"
        else [],
        "story": [{"ago_s": round(now - at, 3), "what": what} for at, what in book.chronicle.lines],
    }


def _state(book: Book) -> str:
    if book.closed:
        return "closed"
    if book.current is None:
        return "forming"
    return "broken" if book.stale else "running"


def render(job: str, view: dict[str, Any]) -> str:
    """``view`` as the text ``torch-mingle status`` prints."""
    out = [
        f"job {job}: {view['state']}, epoch {view['epoch']}, leader {view['leader']} at "
        f"{view['leader_ip']}, nnodes {view['min_nodes']}:{view['max_nodes']}",
    ]
    if view["round"]:
        out.append(
            f"round {view['round']}: {view['world_size']} node(s), formed {view['round_age_s']:.1f}s ago"
        )
    if view["reason"]:
        out.append(f"  {view['reason']}")
    out.append(_row("RANK", "NODE", "ADDRESS", "STATE"))
    for m in view["members"]:
        out.append(_row(m["rank"], m["node"], m["ip"], f"lost: {m['lost']}" if m["lost"] else "in the round"))
    out.extend(_row("spare", s["node"], s["ip"], "waits for a place") for s in view["spares"])
    for h in view["held"]:
        until = "until the round breaks" if h["until_s"] is None else f"for {h['until_s']:.1f}s more"
        out.append(_row("held", h["node"], h["ip"], f"held back by rejoin_delay {until}"))
    for m in view["missing"]:
        out.append(_row("gone", m["node"], m["ip"], f"the next round waits for it: {m['why']}"))
    if view["story"]:
        out.append("recent rounds:")
        out.extend(f"  {s['ago_s']:8.1f}s ago  {s['what']}" for s in view["story"])
    return "\n".join(out)


def _row(rank: object, node: str, ip: str, state: str) -> str:
    return f"  {rank!s:>5}  {node:<16}  {ip:<24}  {state}"
