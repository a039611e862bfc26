"""Discovery forgets the candidates it suspected once their suspicion ends (a bounded table)."""

from __future__ import annotations

from torch_mingle._claims import Timing
from torch_mingle._protocol import MAX_SUSPECTS, Discovery


def test_ended_suspicions_are_forgotten_and_the_table_stays_bounded():
    core = Discovery("job", 1, timing=Timing(suspect_ttl_s=1.0))
    for i in range(3 * MAX_SUSPECTS):
        core._suspect(1000 + i, now=float(i))  # one new suspect a second, each for 1 s
    assert len(core._suspects) <= 2  # before: one row per node ever suspected
    for i in range(3 * MAX_SUSPECTS):
        core._suspect(5000 + i, now=10_000.0)  # many at once: still capped
    assert len(core._suspects) == MAX_SUSPECTS
