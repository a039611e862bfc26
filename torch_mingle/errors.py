"""Errors raised by torch_mingle; all belong to torch's ``RendezvousError`` family."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousStateError,
    RendezvousTimeoutError,
)

from torch_mingle._errors import README_INSTALL, README_NETWORKS, README_SECURITY, StateError

__all__ = [
    "README_INSTALL",
    "README_NETWORKS",
    "README_SECURITY",
    "MingleClosedError",
    "MingleConfigError",
    "MingleConnectionError",
    "MingleError",
    "MingleNetworkError",
    "MingleStateError",
    "MingleTimeoutError",
]


class MingleError(RendezvousError):
    """Base class of every error torch_mingle raises."""


class MingleConfigError(MingleError, ValueError):
    """A ``--rdzv_conf`` value (or handler argument) is invalid; the message shows the value.

    ``fix``: the key and a value that would do, where the message ends with that fix (the
    handler then rewrites it as the whole ``--rdzv_conf``, the user's other keys kept)."""

    def __init__(self, message: str, *, fix: tuple[str, str] | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class MingleTimeoutError(MingleError, RendezvousTimeoutError):
    """The rendezvous did not complete within ``join_timeout``."""


class MingleConnectionError(MingleError, RendezvousConnectionError):
    """The leader's store could not be reached or was lost."""


class MingleNetworkError(MingleConnectionError):
    """A socket could not be set up on the chosen interface; the message says how to fix it."""


class MingleClosedError(MingleError, RendezvousClosedError):
    """The rendezvous of this job was closed (the job finished or failed for good)."""


class MingleStateError(MingleError, RendezvousStateError, StateError):
    """An internal state machine met an event it has no transition for: a bug in torch_mingle
    (the core raises ``_errors.StateError``; the agent sees it as this)."""
