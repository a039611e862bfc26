"""A site's health check, run before each join (``health_check=COMMAND``), and the example check.

How it works
------------
Before every join the handler runs ``COMMAND`` with ``/bin/sh -c`` in a session of its own,
bounded by ``health_check_timeout``; on a timeout the whole process group is killed. Exit 0
lets the node join. Anything else keeps it out of the round: the node does not join (the
others form their round without it), waits ``HEALTH_RETRY_S`` and runs the check again, until
``join_timeout`` ends the wait with an error that carries the check's last output.

``torch-mingle check-gpu`` (``check_gpu``) is an example check: CUDA visible, a small
allocation and a kernel on every GPU, NCCL loadable. On a machine without a GPU it says so and
exits 0, so one command line serves a mixed cluster.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torch_mingle._record import record

#: Seconds between two runs of a failing check.
HEALTH_RETRY_S = 5.0
#: Seconds for a killed check to be reaped.
REAP_S = 2.0
#: What an error quotes of a failing check's output: its end.
OUTPUT_TAIL_CHARS = 2000
#: How often the output reader looks whether it must stop.
READ_SLICE_S = 0.05


@record
class Verdict:
    ok: bool
    #: Why not, in one line: the exit status or the timeout.
    why: str = ""
    #: The end of what the check printed (stdout and stderr together).
    output: str = ""


def run_check(command: str, timeout_s: float) -> Verdict:
    """Run ``command`` once, bounded by ``timeout_s``; never raises for the command's sake.

    Its output goes to a pipe that a thread of ours reads, keeping only its end
    (``OUTPUT_TAIL_CHARS``): a check that prints without end costs neither memory nor disk.
    Once the check's own process has ended, the pipe is closed: a process it left behind
    (one that left its process group) gets EPIPE for what it writes, and keeps no read of
    ours waiting.
    """
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills what it started too
        )
    except OSError as exc:
        os.close(read_end)
        return Verdict(ok=False, why=f"it could not start: {exc}")
    finally:
        os.close(write_end)
    out = _Tail(read_end)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            why = f"it ran over {timeout_s:g}s, and SIGKILL did not end it (hung in the kernel?)"
            return Verdict(ok=False, why=why, output=out.close())
        return Verdict(ok=False, why=f"it did not finish within {timeout_s:g}s", output=out.close())
    except BaseException:  # a signal for the agent (torch's SignalException): the check goes too
        _kill_group(proc)
        out.close()
        raise
    if code == 0:
        return Verdict(ok=True, output=out.close())
    why = f"it was killed by signal {-code}" if code < 0 else f"it exited with status {code}"
    return Verdict(ok=False, why=why, output=out.close())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Tail:
    """Reads a check's output pipe on a thread of its own, keeping the last ``OUTPUT_TAIL_CHARS``
    bytes; ``close`` takes what is left without waiting and closes the pipe."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._kept = b""
        self._total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="mingle-health-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        poller = select.poll()  # not select(): the agent may hold descriptors past 1023
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if poller.poll(READ_SLICE_S * 1000) and not self._take():
                return  # end of file: every writer closed it

    def _take(self) -> bool:
        try:
            chunk = os.read(self._fd, 65536)
        except OSError:
            return False
        self._total += len(chunk)
        self._kept = (self._kept + chunk)[-OUTPUT_TAIL_CHARS:]
        return bool(chunk)

    def close(self) -> str:
        """What the check printed, its end, once its process ended; the pipe is closed."""
        self._stop.set()
        self._thread.join()
        os.set_blocking(self._fd, False)
        with contextlib.suppress(BlockingIOError):
            while self._take():  # what it wrote last, up to what a left-behind process adds now
                if self._total > 16 * OUTPUT_TAIL_CHARS:
                    break
        os.close(self._fd)
        text = self._kept.decode(errors="replace").strip()
        return text if self._total <= OUTPUT_TAIL_CHARS else "..." + text


def wait_until_healthy(
    command: str,
    timeout_s: float,
    deadline: float,
    *,
    on_failure: Callable[[Verdict], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Verdict:
    """Run the check until it passes or ``deadline`` (``clock`` time) is reached; the last verdict.

    Each run is bounded by ``timeout_s`` and by what is left before ``deadline``.
    """
    last: Verdict | None = None
    while True:
        left = deadline - clock()
        if left <= 0:
            return last or Verdict(ok=False, why="no time was left to run it")
        verdict = run_check(command, min(timeout_s, left))
        if verdict.ok:
            return verdict
        on_failure(verdict)
        last = verdict
        sleep(max(0.0, min(HEALTH_RETRY_S, deadline - clock())))


def check_gpu() -> tuple[int, str]:
    """``torch-mingle check-gpu``: its exit status and what it says. 0 when every GPU computes
    and NCCL loads, and when there is no GPU (skipped)."""
    import torch  # noqa: PLC0415 - the command's own work

    if not torch.cuda.is_available():
        devices = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
        if devices:  # GPUs there, CUDA not usable: a broken driver or CUDA set-up is sick
            return (
                1,
                f"check-gpu: {len(devices)} NVIDIA device(s) in /dev, but CUDA is not available to torch",
            )
        return 0, "check-gpu: no CUDA device on this machine; nothing to check (skipped)"
    n = 1 << 20
    expected = float(n * (n - 1))  # the sum of 2 * (0 .. n-1)
    try:
        for index in range(torch.cuda.device_count()):
            with torch.cuda.device(index):
                total = float((torch.arange(n, dtype=torch.float64, device="cuda") * 2).sum().item())
                torch.cuda.synchronize()
            if total != expected:
                return 1, f"check-gpu: cuda:{index} computed {total}, expected {expected}"
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except Exception as exc:  # any failure is the verdict: say it, do not raise
        return 1, f"check-gpu: {type(exc).__name__}: {exc}"
    return 0, f"check-gpu: {torch.cuda.device_count()} GPU(s) compute; NCCL {version} loads"
