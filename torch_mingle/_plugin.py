"""The ``torchrun.handlers`` entry point.

torch's rendezvous registry loads this module when ``torch.distributed.elastic.rendezvous``
is imported and calls ``mingle()`` with no arguments; what it returns is registered as the
creator of the ``mingle`` backend. This module therefore imports nothing heavy: the handler
module loads only when torchrun actually asks for a ``mingle`` handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Create a ``MingleRendezvousHandler`` from torchrun's parameters."""
    from torch_mingle.handler import MingleRendezvousHandler  # noqa: PLC0415 - keep the entry point cheap

    return MingleRendezvousHandler.from_params(params)


def mingle() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """Entry point: return the handler creator (always the same object, so re-registration is a no-op)."""
    return create_handler
