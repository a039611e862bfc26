"""The board the agent's thread waits on: every wait bounded, an answer wakes it at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from torch_mingle._board import Board
from torch_mingle._notes import MAX_PENDING_NOTES, Note
from torch_mingle._ready import Ticket
from torch_mingle._view import Diagnostics


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


REENTRY = """
import os, signal
from torch_mingle._notes import MAX_PENDING_NOTES, Note
from torch_mingle._board import Board
from torch_mingle._ready import Ticket
from torch_mingle._view import Diagnostics

board = Board(Diagnostics(node_id="1", job="job", role="idle"))
ticket = Ticket("leave", 1)
board.resolve(ticket, result=True)
seen = []
signal.signal(signal.SIGUSR1, lambda *_: seen.append(board.wait(ticket, grace_s=1.0)))
# The predicate runs under the board's lock: the signal's handler runs on this (the main)
# thread inside that call, as torch's SIGTERM does while the agent polls num_nodes_waiting().
board.wait_for(lambda d: os.kill(os.getpid(), signal.SIGUSR1) is None and bool(seen), 5.0)
print("handled", seen)
"""


def test_a_signal_handler_that_waits_on_the_board_inside_a_board_call_does_not_deadlock():
    """The SIGTERM hook leaves the job from the main thread, which may hold the board's lock."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", REENTRY], capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the handler deadlocked on the board's lock")
    assert done.returncode == 0 and "handled [True]" in done.stdout, done.stdout + done.stderr


def test_events_posted_during_a_wait_are_recorded_on_the_waiting_thread_before_the_answer():
    board = _board()
    ticket = Ticket("join", 3)
    ticket.deadline = time.monotonic() + 30.0
    seen: list[tuple[str, str]] = []

    def loop_thread() -> None:
        board.post_note(Note("leader_found", "follows"))
        board.post_note(Note("round_complete", "round 1"))
        board.resolve(ticket, result="round")

    worker = threading.Thread(target=loop_thread)
    worker.start()
    result = board.wait(
        ticket,
        grace_s=1.0,
        on_notes=lambda notes: seen.extend((n.name, threading.current_thread().name) for n in notes),
    )
    worker.join(5.0)
    assert result == "round"
    me = threading.current_thread().name
    assert seen == [("leader_found", me), ("round_complete", me)]
    assert board.take_notes() == []


def test_events_nobody_records_are_bounded():
    board = _board()
    for i in range(MAX_PENDING_NOTES + 10):
        board.post_note(Note("keep_alive", str(i)))
    notes = board.take_notes()
    assert len(notes) == MAX_PENDING_NOTES and notes[0].message == "10"  # the oldest went first


def test_a_recorder_slower_than_the_events_never_keeps_the_answer_waiting():
    board = _board()
    ticket = Ticket("join", 4)
    ticket.deadline = time.monotonic() + 30.0
    stop = threading.Event()

    def chatty_loop() -> None:  # an event every 10 ms, for ever
        while not stop.is_set():
            board.post_note(Note("keep_alive", "beat"))
            time.sleep(0.01)

    noisy = threading.Thread(target=chatty_loop)
    noisy.start()
    timer = threading.Timer(0.2, lambda: board.resolve(ticket, result="round"))
    timer.start()
    started = time.monotonic()
    try:
        result = board.wait(ticket, grace_s=1.0, on_notes=lambda notes: time.sleep(0.05))
    finally:
        stop.set()
        timer.cancel()
        noisy.join(5.0)
    assert result == "round"
    assert time.monotonic() - started < 5.0


_STOPPED_CHILD = """
import sys, threading, time
from torch_mingle._board import Board
from torch_mingle._record import replace
from torch_mingle._view import Diagnostics
board = Board(Diagnostics(node_id="1", job="job", role="idle"))
# The node's word comes 0.3 s after the thaw (the parent stops this process at 0.2 s for 2 s).
threading.Timer(2.5, lambda: board.publish(replace(board.diagnostics(), closed=True))).start()
print("ready", flush=True)
got = board.wait_for(lambda d: d.closed, 1.0, running=True)
print("word" if got is not None else "no word", flush=True)
"""


def test_a_wait_for_the_nodes_word_counts_only_time_the_process_ran():
    """A process stopped (SIGSTOP) while it waits for its node's word: after the thaw the node
    gets the rest of its time, so a wait of 1 s that a 2 s stop spans does not end at the thaw."""
    child = subprocess.Popen([sys.executable, "-c", _STOPPED_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # into the wait, then stopped for longer than the wait
        child.send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        child.send_signal(signal.SIGCONT)
        out, _ = child.communicate(timeout=30)
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
    assert out.strip() == "word"
