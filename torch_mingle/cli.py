"""``torch-mingle doctor|ls|--version`` (or ``python -m torch_mingle``): what discovery sees.

* ``doctor`` lists the interfaces, checks that each can join the group and send to it, and
  (with ``--job``) exchanges datagrams for a few seconds with every other node running
  ``doctor --job`` with the same name, by multicast and by subnet broadcast. It reports who
  each interface hears, the jobs and the dropped datagrams seen on the group, and exits
  non-zero with advice when multicast reaches nobody.
* ``ls`` lists the rendezvous jobs visible on the segment: every leader answers a probe.
* ``check-gpu`` is an example of a health check (``health_check=torch-mingle check-gpu``):
  every GPU computes and NCCL loads; skipped, with exit status 0, on a machine without a GPU.

This module only parses: the commands (and torch, which they import) load after that, so
``--version`` and ``--help`` answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from torch_mingle import __version__


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torch-mingle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--version", action="version", version=f"torch-mingle {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("doctor", "check discovery on this node's networks"),
        ("ls", "list visible jobs"),
    ):
        c = sub.add_parser(name, help=help_text)
        c.add_argument(
            "--interface", default=os.environ.get("TORCH_MINGLE_INTERFACE"), help="name or address"
        )
        c.add_argument(
            "--group",
            default=os.environ.get("TORCH_MINGLE_GROUP"),
            help="multicast group (default: the job's)",
        )
        c.add_argument(
            "--port",
            type=int,
            default=os.environ.get("TORCH_MINGLE_PORT"),
            help="discovery port (default: the job's)",
        )
        c.add_argument("--secret-file", default=None, help="to sign probes for jobs that use a secret")
        c.add_argument("--seconds", type=float, default=3.0 if name == "doctor" else 1.5)
        if name == "doctor":
            c.add_argument(
                "--job", default=None, help="exchange datagrams with other nodes running doctor --job"
            )
        else:
            c.add_argument("--json", action="store_true")
    sub.add_parser("check-gpu", help="an example health check: every GPU computes, NCCL loads")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check-gpu":
        from torch_mingle._health import check_gpu  # noqa: PLC0415 - imports torch

        code, said = check_gpu()
        print(said)
        return code
    from torch_mingle._doctor import run  # noqa: PLC0415 - imports torch: only once there is work

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
