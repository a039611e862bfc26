"""Fixtures for the netns tier: a fresh segment per test, torn down also on failure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.netns.segment import Segment, netns_available


@pytest.fixture
def segment() -> Iterator[Segment]:
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    seg = Segment()
    try:
        seg.create_bridge()
        yield seg
    finally:
        seg.destroy()
