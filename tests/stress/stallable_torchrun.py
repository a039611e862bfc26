"""torchrun whose agent can be stalled: on SIGUSR2 its main thread holds the GIL for
``MINGLE_STALL_S`` seconds (default 1), as a huge pickle or a long C call in the agent would.

Every thread of the agent stops for that long, the mingle loop included: no heartbeat goes out
and none is read. The hold is a call into libc through ``ctypes.PyDLL``, whose calls keep the
GIL, so it lasts the wall-clock time asked for however loaded the machine is (a CPU-bound loop
would stretch with the load). The agent logs each hold with its measured length.

    python -m tests.stress.stallable_torchrun --nnodes=... train.py ...   # as torchrun
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from types import FrameType

_LIBC = ctypes.PyDLL(None)  # PyDLL: the GIL stays held for the whole call


def hold_gil(seconds: float) -> float:
    """Hold the GIL for ``seconds`` of wall-clock time; the seconds it was held."""
    start = time.monotonic()
    _LIBC.usleep(ctypes.c_uint(int(seconds * 1_000_000)))
    return time.monotonic() - start


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    held = hold_gil(float(os.environ.get("MINGLE_STALL_S", "1")))
    sys.stderr.write(f"stallable torchrun: the agent held the GIL for {held:.3f}s\n")
    sys.stderr.flush()


def main() -> None:
    signal.signal(signal.SIGUSR2, _on_signal)
    from torch.distributed.run import main as torchrun  # after the handler is in

    torchrun()


if __name__ == "__main__":
    main()
