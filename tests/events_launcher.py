"""torchrun, with a rendezvous event handler installed the way a site installs one.

torch sends rendezvous events to the logger of its ``dynamic_rendezvous`` destination, whose
handler is a ``NullHandler`` until a site puts its own in ``handlers._log_handlers``. This one
appends each event (JSON, as torch serialises it) to ``$EVENTS_FILE``, then runs torchrun.
"""

from __future__ import annotations

import logging
import os
import sys

from torch.distributed.elastic.events import handlers
from torch.distributed.run import main


class _ToFile(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        with open(self.path, "a") as out:  # one short line per write: appends do not interleave
            out.write(record.getMessage() + "\n")


if __name__ == "__main__":
    handlers._log_handlers["dynamic_rendezvous"] = _ToFile(os.environ["EVENTS_FILE"])
    sys.exit(main())
