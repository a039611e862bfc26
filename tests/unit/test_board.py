"""The board the agent's thread waits on: every wait bounded, an answer wakes it at once."""

from __future__ import annotations

import threading
import time

from torch_mingle._node import Board, Diagnostics, Ticket


def _board() -> Board:
    return Board(Diagnostics(node_id="1", job="job", role="idle"))


def test_answered_within_wakes_at_the_answer_and_ends_at_its_timeout_without_one():
    board = _board()
    ticket = Ticket("join", 1)
    started = time.monotonic()
    assert board.answered_within(ticket, 0.05) is False
    assert time.monotonic() - started >= 0.05
    timer = threading.Timer(0.05, lambda: board.resolve(ticket, result="round"))
    timer.start()
    try:
        assert board.answered_within(ticket, 30.0) is True
    finally:
        timer.cancel()
    assert board.wait(ticket, grace_s=1.0) == "round"


def test_answered_within_returns_at_once_when_the_loop_failed():
    board = _board()
    board.fail(RuntimeError("the loop died"))
    started = time.monotonic()
    assert board.answered_within(Ticket("join", 2), 30.0) is True  # the wait that follows raises why
    assert time.monotonic() - started < 5.0
