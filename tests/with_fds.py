"""Run a command with N extra open descriptors, as a busy process (a leader with 1,000 workers' store
connections) has: ``python tests/with_fds.py 1100 torchrun ...``. Raises the soft limit to make room."""

from __future__ import annotations

import os
import resource
import sys


def main() -> None:
    count, cmd = int(sys.argv[1]), sys.argv[2:]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 4096
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    for _ in range(count):
        os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)
    print(f"with {count} extra descriptors", flush=True)
    os.execvp(cmd[0], cmd)  # noqa: S606 - a fixed argument list from the test


if __name__ == "__main__":
    main()
