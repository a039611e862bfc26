"""What a Slurm job already says, read so that its script needs no address and no id.

* The job's id is the rendezvous id when torchrun's default (``--rdzv_id=none``) is passed.
* The step's (else the job's) node list, expanded by python-hostlist, is a list of standby
  peers: the loop sends discovery datagrams to them by unicast once multicast has stayed silent
  for ``STANDBY_AFTER_S`` (``_loop``), so a job forms on a Slurm network that drops multicast.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import hostlist

from torch_mingle.errors import MingleConfigError

log = logging.getLogger(__name__)

#: torchrun's default ``--rdzv_id``: no id given.
TORCHRUN_DEFAULT_ID = "none"
JOB_ID_ENV = "SLURM_JOB_ID"
NODELIST_ENVS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
#: Seconds of silence on the multicast group before the node list is tried by unicast.
STANDBY_AFTER_S = 2.0
#: A node that heard others by multicast must be alone at this many looks in a row (6 s: longer
#: than a failover at the default heartbeats) before it unicasts to the node list.
STANDBY_CHECKS = 3
#: A node list longer than this is not used: unicast to every host costs O(N) per datagram.
MAX_STANDBY_HOSTS = 1024


def run_id(given: str, environ: Mapping[str, str]) -> str:
    """``given``, or the Slurm job's id when torchrun passed its default ``none``."""
    job = environ.get(JOB_ID_ENV, "").strip()
    return job if given == TORCHRUN_DEFAULT_ID and job else given


def standby_hosts(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The Slurm step's (else job's) hosts, for unicast when multicast stays silent; () outside
    Slurm or for a list too long to send to."""
    for var in NODELIST_ENVS:
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        try:
            hosts = tuple(hostlist.expand_hostlist(raw))
        except hostlist.BadHostlist as exc:
            raise MingleConfigError(
                f"${var}={raw!r} is not a Slurm host list ({exc}); unset it, or give the hosts "
                "with --rdzv_conf peers=HOST;HOST"
            ) from None
        if len(hosts) > MAX_STANDBY_HOSTS:
            log.info("$%s names %d hosts: too many to reach one by one; not used", var, len(hosts))
            return ()
        return hosts
    return ()
