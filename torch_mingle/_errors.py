"""What the core raises, without torch: ``StateError``, a state machine that met an event it
has no transition for (a bug in torch_mingle), and the pages error messages point to.

The public errors (``errors``) belong to torch's ``RendezvousError`` family; the shells turn a
``StateError`` into ``errors.MingleStateError`` where it reaches the agent (``_board``)."""

from __future__ import annotations

README_INSTALL = "README.md#install"
README_NETWORKS = "docs/networks.md"
README_SECURITY = "docs/security.md"


class StateError(Exception):
    """An internal state machine met an event it has no transition for: a bug in torch_mingle."""
