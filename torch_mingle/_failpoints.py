"""Failpoints as the core sees them: named places where a test makes it fail on purpose
(``hit``), off unless armed. Arming them, with the lock and the clock that takes, is the
shell's (``_faults``, which installs its check here when it is imported)."""

from __future__ import annotations

from collections.abc import Callable


class FailpointError(RuntimeError):
    """Raised at an armed failpoint."""


#: The armed check (``_faults.hit``); None until ``_faults`` is imported.
check: Callable[[str], None] | None = None


def hit(name: str) -> None:
    """Raise if ``name`` is armed (``_faults``); nothing at all otherwise."""
    if check is not None:
        check(name)
