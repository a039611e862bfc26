"""``torch-mingle doctor|ls|status|--version`` (or ``python -m torch_mingle``): what discovery sees.

* ``doctor`` lists the interfaces, checks that each can join the group and send to it, and
  (with ``--job``) exchanges datagrams for a few seconds with every other node running
  ``doctor --job`` with the same name, by multicast and by subnet broadcast. It reports who
  each interface hears, the jobs and the dropped datagrams seen on the group, and exits
  non-zero with advice when multicast reaches nobody.
* ``ls`` lists the rendezvous jobs visible on the segment: every leader answers a probe.
* ``status JOB`` shows one job as its leader sees it (``_status``, ``_jobview``).
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

#: What ``torch-mingle --help`` says: plain text (the docstring is for developers).
DESCRIPTION = "See and check mingle rendezvous jobs on this node's networks."
EPILOG = "Run `torch-mingle COMMAND --help` for a command's options."

COMMANDS = {
    "doctor": (
        "check that multicast works here, and (with --job) which nodes it reaches",
        "List the interfaces, join the multicast group on each and send to it; with --job, exchange "
        "datagrams for --seconds with every other node running `doctor --job` with the same name, by "
        "multicast and by broadcast, and say who each interface reaches. Exits 1 with advice when "
        "multicast reaches nobody.",
    ),
    "status": (
        "show a job as its leader sees it: members and ranks, spares, held-back nodes, recent rounds",
        "Find the leader of JOB (as ls does) and ask it over its control port: its epoch, the round, every "
        "member with its node rank and address, the spares, the nodes held back by rejoin_delay and until "
        "when, the members the next round waits for and why, and what ended and began the last rounds. A "
        "job with a secret answers only with --secret-file.",
    ),
    "ls": (
        "list the rendezvous jobs whose leaders answer on this network",
        "Ask every leader on the group which job it leads, and list them: leader, nodes, "
        "min:max, round, epoch and state. Jobs that use a secret answer only with --secret-file.",
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torch-mingle", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"torch-mingle {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, (help_text, description) in COMMANDS.items():
        c = sub.add_parser(name, help=help_text, description=description)
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
        if name == "status":
            c.add_argument("job", help="the job's --rdzv_id")
            c.add_argument("--watch", type=float, default=0.0, metavar="SECONDS", help="again every SECONDS")
    sub.add_parser(
        "check-gpu",
        help="an example health check: every GPU computes and NCCL loads",
        description="An example health check (health_check=torch-mingle check-gpu): every GPU computes "
        "and NCCL loads. Exit status 0 (skipped) on a machine without a GPU.",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check-gpu":
        from torch_mingle._health import check_gpu  # noqa: PLC0415 - imports torch

        code, said = check_gpu()
        print(said)
        return code
    if args.command == "status":
        from torch_mingle._status import run  # noqa: PLC0415 - imports torch: only once there is work
    else:
        from torch_mingle._doctor import run  # noqa: PLC0415

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
