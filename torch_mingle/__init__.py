"""torch_mingle: a torchrun rendezvous backend that finds rank 0 by IP multicast.

Importing this package is cheap: it opens no socket, starts no thread and does not import
torch. The heavy modules load on first use of the names below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
BACKEND_NAME = "mingle"

__all__ = [
    "BACKEND_NAME",
    "MingleConfig",
    "MingleRendezvousHandler",
    "Rendezvous",
    "__version__",
    "create_handler",
    "rendezvous",
]

if TYPE_CHECKING:
    from torch_mingle._plugin import create_handler
    from torch_mingle.config import MingleConfig
    from torch_mingle.handler import MingleRendezvousHandler
    from torch_mingle.standalone import Rendezvous, rendezvous

_LAZY = {
    "rendezvous": "torch_mingle.standalone",
    "Rendezvous": "torch_mingle.standalone",
    "create_handler": "torch_mingle._plugin",
    "MingleConfig": "torch_mingle.config",
    "MingleRendezvousHandler": "torch_mingle.handler",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torch_mingle' has no attribute {name!r}")
    import importlib  # noqa: PLC0415 - deferred so that importing the package stays cheap

    return getattr(importlib.import_module(module), name)
