"""Host processes that a benchmark drives over stdin/stdout, one JSON line per answer.

A benchmark starts ``Hosts`` (each a Python process running one of its own functions), then
talks to them in steps: ``send`` a command to some of them, ``expect`` one answer line from
each, with one deadline for all. A host that dies or stays silent ends the step with an error
naming it, never a hang. ``close`` continues (SIGCONT) and kills whatever is still running,
also when the benchmark fails half way.

``isolated_resolver()`` runs hosts in a private mount namespace whose ``/etc/resolv.conf``
names no reachable server: torch's TCPStore client asks DNS for the name of every peer
address it connects to, and a thousand simulated nodes on one machine would all ask the
same resolver at once (see ``benchmarks/scale_rendezvous.py``, section ``dns``).
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch_mingle

ROOT = Path(__file__).resolve().parent.parent


def compile_package() -> None:
    """Write torch_mingle's bytecode before anything is timed, as installing a wheel does.

    Every benchmark calls this first: a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` and a
    module edited since its last compile would compile it again in every agent and host
    process, and the benchmark would time the compiler (rendezvous as the agent sees it, N=4:
    127 to 161 ms instead of 46 to 66 ms here). Bytecode already up to date is left alone.
    """
    compileall.compile_dir(str(Path(torch_mingle.__file__).parent), quiet=1)


class HostError(RuntimeError):
    """A host process died, answered garbage or missed its deadline."""


class Host:
    """One host process; its stdout lines are read by a thread into a queue."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(line)
            else:
                sys.stderr.write(f"[{self.name}] {line}")
        self.lines.put(None)  # end of output: the process exited

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise HostError(f"{self.name} is gone (exit {self.proc.poll()}): {exc}") from exc

    def expect(self, deadline: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise HostError(f"{self.name} did not answer in time") from None
        if line is None:
            self.lines.put(None)
            raise HostError(f"{self.name} exited ({self.proc.wait()}) without answering")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer and answer.get("fatal"):
            raise HostError(f"{self.name}: {answer['error']}")
        return answer

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float) -> None:
        """Close stdin (a host exits when it reads EOF), then kill what is still running."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process must not stay stopped
            self.proc.kill()
        self.proc.wait()


class Hosts:
    """Every host of one measurement; a context manager that always cleans up."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self.prefix = list(prefix)
        self.all: list[Host] = []

    def start(self, name: str, script: Path, args: Sequence[str]) -> Host:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        host = Host(name, [*self.prefix, sys.executable, str(script), *args], env)
        self.all.append(host)
        return host

    @staticmethod
    def send(hosts: Iterable[Host], command: dict[str, Any]) -> None:
        for h in hosts:
            h.send(command)

    @staticmethod
    def expect(hosts: Iterable[Host], timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        return [h.expect(deadline) for h in hosts]

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.all:
            if h.proc.poll() is None and exc[0] is not None:
                h.kill()
        for h in self.all:
            h.stop(timeout_s=30)


def serve(handle: Any) -> int:
    """The host side: one JSON command per stdin line, ``handle(command)`` answers with a dict.

    EOF ends the loop. An exception becomes a fatal answer, which the driver raises.
    """
    for line in sys.stdin:
        command = json.loads(line)
        try:
            answer = handle(command)
        except Exception as exc:  # reported to the driver, which names this host
            answer = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "fatal": True}
        print(json.dumps(answer), flush=True)
        if command.get("cmd") == "stop":
            break
    return 0


def usage() -> dict[str, float]:
    """This process's CPU seconds, peak memory and open descriptors."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "peak_rss_mib": ru.ru_maxrss / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
    }


class isolated_resolver:
    """A command prefix that gives hosts a resolver that answers at once ("connection refused").

    Needs ``unshare`` and root (or user namespaces); ``prefix`` is empty and ``why_not`` says
    why where neither is there, and the hosts then use the machine's resolver.
    """

    def __init__(self, wanted: bool = True) -> None:
        self.prefix: list[str] = []
        self.why_not = "" if wanted else "not asked for"
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        if not wanted:
            return
        unshare = shutil.which("unshare")
        if unshare is None or not Path("/etc/resolv.conf").exists():
            self.why_not = "no unshare command or no /etc/resolv.conf"
            return
        self._dir = tempfile.TemporaryDirectory(prefix="mingle-resolv-")
        conf = Path(self._dir.name) / "resolv.conf"
        conf.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        flags = ["--mount"] if os.geteuid() == 0 else ["--mount", "--map-root-user"]
        self.prefix = [
            unshare,
            *flags,
            "sh",
            "-c",
            f'mount --bind {conf} /etc/resolv.conf && exec "$@"',
            "sh",
        ]
        probe = subprocess.run(
            [*self.prefix, "true"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode != 0:
            self.why_not = f"unshare failed: {probe.stderr.strip()[:200]}"
            self.prefix = []

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
