"""The health check before each join (``_health``): every run bounded, its output kept."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from torch_mingle._health import HEALTH_RETRY_S, OUTPUT_TAIL_CHARS, Verdict, run_check, wait_until_healthy


def test_a_passing_and_a_failing_check():
    assert run_check("echo fine", 10).ok
    failed = run_check("echo 'GPU 3: ECC errors'; exit 3", 10)
    assert not failed.ok
    assert failed.why == "it exited with status 3" and failed.output == "GPU 3: ECC errors"
    assert run_check("kill -9 $$", 10).why == "it was killed by signal 9"


def test_a_check_that_hangs_is_killed_with_what_it_started_at_its_timeout():
    started = time.monotonic()
    verdict = run_check("echo probing; sleep 60 & sleep 60", 0.5)
    assert time.monotonic() - started < 10
    assert not verdict.ok and verdict.why == "it did not finish within 0.5s"
    assert verdict.output == "probing"


def test_a_check_that_leaves_a_daemon_behind_passes_at_once():
    started = time.monotonic()
    verdict = run_check("echo started; setsid sleep 5 & exit 0", 10)
    assert time.monotonic() - started < 4  # its output is a file: nothing waits for the daemon
    assert verdict.ok and verdict.output == "started"


def test_only_the_end_of_a_long_output_is_kept():
    verdict = run_check("seq 1 100000; exit 1", 10)
    assert len(verdict.output) <= OUTPUT_TAIL_CHARS + 3 and verdict.output.endswith("100000")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_failing_check_is_run_again_until_the_deadline():
    clock, failures = Clock(), list[Verdict]()
    verdict = wait_until_healthy("exit 1", 5, 3 * HEALTH_RETRY_S + 1, on_failure=failures.append,
                                 clock=clock, sleep=clock.sleep)  # fmt: skip
    assert not verdict.ok and len(failures) == 4  # at 0, 5, 10 and 15 s; none fits after that


def test_a_check_that_passes_again_ends_the_wait(tmp_path):
    clock, failures = Clock(), []
    flag = tmp_path / "healthy"

    def fail_then_heal(verdict):
        failures.append(verdict)
        if len(failures) == 2:
            flag.touch()  # the node was repaired

    verdict = wait_until_healthy(
        f"test -e {flag}", 5, 600, on_failure=fail_then_heal, clock=clock, sleep=clock.sleep
    )
    assert verdict.ok and len(failures) == 2


def test_a_process_a_check_leaves_behind_cannot_fill_the_disk_or_memory_with_its_output(tmp_path):
    """A check that starts a writer in a session of its own (out of its process group) and exits
    0: once the check ended, what that writer prints goes nowhere (EPIPE: it ends), not into a
    file that nobody reads."""
    pid_file = tmp_path / "pid"
    command = f"setsid sh -c 'echo $$ > {pid_file}; while :; do echo spam; done' & sleep 0.2; echo checked"
    verdict = run_check(command, 10.0)
    pid = int(pid_file.read_text())
    try:
        assert verdict.ok  # (its output is the writer's spam, its end only:)
        assert len(verdict.output) <= OUTPUT_TAIL_CHARS + 3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists(), "the left-behind writer still writes somewhere"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
