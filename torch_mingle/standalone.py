"""``rendezvous()``: the mingle rendezvous for programs that torchrun does not start.

Each process calls ``rendezvous(job, world_size)`` and gets its rank and rank 0's address,
found by multicast like under torchrun: usable from ``torch.multiprocessing.spawn``, a SLURM
script, or anything that starts the same program N times without telling it an address::

    with torch_mingle.rendezvous("job42", world_size=8) as rdzv:
        dist.init_process_group("gloo")       # env:// reads what rendezvous() set
        ...                                   # rdzv.rank, rdzv.world_size, rdzv.master_addr
"""

from __future__ import annotations

import os
from datetime import timedelta
from types import TracebackType
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters

from torch_mingle._record import field, record
from torch_mingle.handler import MingleRendezvousHandler


@record(frozen=False)
class Rendezvous:
    """One process's place in the job; ``close()`` (or leaving the ``with``) releases it."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    handler: MingleRendezvousHandler = field(repr=False)

    def env(self) -> dict[str, str]:
        """The ``env://`` variables; the store already runs on rank 0, so every rank is its client."""
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    def set_env(self) -> None:
        os.environ.update(self.env())

    def store(self, timeout_s: float = 300.0) -> TCPStore:
        """A client of the job's store, for ``init_process_group(store=..., rank=..., world_size=...)``."""
        return TCPStore(self.master_addr, self.master_port, None, False, timeout=timedelta(seconds=timeout_s))

    def close(self) -> None:
        """Leave the job; rank 0 keeps the store up until every rank has left (``close_timeout``)."""
        self.handler.shutdown()

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def rendezvous(
    job_id: str, world_size: int, *, min_world_size: int | None = None, set_env: bool = True, **conf: Any
) -> Rendezvous:
    """Meet the other processes of ``job_id``; returns this process's rank and rank 0's address.

    ``conf`` takes the keys of ``--rdzv_conf`` (``interface``, ``port``, ``join_timeout``,
    ``secret_file``, ...). With ``min_world_size`` the job starts with fewer processes after
    ``last_call_timeout``. ``set_env`` exports MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE for
    ``init_process_group(init_method="env://")``.
    """
    conf_str = {k: str(v) for k, v in conf.items()}
    params = RendezvousParameters("mingle", "", job_id, min_world_size or world_size, world_size, **conf_str)
    handler = MingleRendezvousHandler.from_params(params)
    try:
        info = handler.next_rendezvous()
    except BaseException:
        handler.shutdown()
        raise
    boot = info.bootstrap_store_info
    if boot is None:  # pragma: no cover - the mingle handler always sets it
        raise RuntimeError("the rendezvous returned no bootstrap address")
    result = Rendezvous(info.rank, info.world_size, boot.master_addr, boot.master_port, handler)
    if set_env:
        result.set_env()
    return result
