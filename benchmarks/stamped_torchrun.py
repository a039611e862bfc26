"""torchrun, with every agent's next_rendezvous() stamped (for the latency benchmark).

Runs torch's own ``torch.distributed.run.main`` unchanged; the only addition is a wrapper
around the handler's ``next_rendezvous`` that appends ``{"t_ask", "t_in", "t_out", "rank", "pid"}``
as a JSON line to the file named by ``BENCH_STAMPS``; ``t_ask`` is when torchrun asked the
registry for the handler (creating it: importing the backend's modules, starting its threads)
and is written with the handler's first rendezvous only. Works for every backend.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters, api


def _stamp(record: dict[str, Any]) -> None:
    path = os.environ.get("BENCH_STAMPS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _install() -> None:
    registry = api.rendezvous_handler_registry
    create = registry.create_handler

    def create_stamped(params: RendezvousParameters) -> Any:
        asked = [time.time()]
        handler = create(params)
        inner = handler.next_rendezvous

        def next_rendezvous() -> Any:
            t_in = time.time()
            info = inner()
            t_out, pid = time.time(), os.getpid()
            record = {"kind": "rdzv", "t_in": t_in, "t_out": t_out, "rank": info.rank, "pid": pid}
            if asked:
                record["t_ask"] = asked.pop()
            _stamp(record)
            return info

        handler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]
        return handler

    registry.create_handler = create_stamped  # type: ignore[method-assign]


if __name__ == "__main__":
    _install()
    from torch.distributed.run import main

    sys.exit(main())
