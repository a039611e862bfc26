"""torchrun, with its agent's polls shifted by ``$POLL_SHIFT_S`` against the other agents'.

Agents that start their workers together poll ``num_nodes_waiting()`` in step; over a long
run their monitor loops drift apart by up to a monitor interval (each loop's own work differs).
This launcher makes that drift happen at once: the agent's first sleep of its monitor loop is
longer by ``$POLL_SHIFT_S`` seconds, and every poll after it comes that much later.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType

from torch.distributed.elastic.agent.server import api
from torch.distributed.run import main


class _ShiftedTime(ModuleType):
    """The agent module's ``time``: its first ``sleep`` longer by ``shift`` seconds."""

    def __init__(self, shift: float) -> None:
        super().__init__("time")
        self.shift = shift

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        extra, self.shift = self.shift, 0.0
        time.sleep(seconds + extra)


if __name__ == "__main__":
    api.time = _ShiftedTime(float(os.environ["POLL_SHIFT_S"]))
    sys.exit(main())
