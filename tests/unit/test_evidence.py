"""Who is gone (``_evidence.judge``): only a node's own word takes its vote; a partition that
answers with resets must not split a job in two."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from tests.swarm import scenario as sc
from tests.swarm.harness import run
from torch_mingle import _evidence
from torch_mingle._evidence import Evidence, Verdict, judge, of_errno

REGRESSIONS = json.loads((Path(__file__).parents[1] / "swarm" / "regressions.json").read_text())


def test_only_the_peers_own_word_takes_its_vote():
    for evidence in Evidence:
        assert judge(evidence).votes is (evidence is not Evidence.LEFT), evidence


def test_socket_errors_are_reported_as_what_the_kernel_saw():
    assert of_errno(errno.ECONNREFUSED) is Evidence.REFUSED
    assert {of_errno(errno.ECONNRESET), of_errno(errno.EPIPE), of_errno(errno.ECONNABORTED)} == {
        Evidence.RESET
    }
    assert of_errno(errno.ETIMEDOUT) is Evidence.UNREACHABLE


@pytest.mark.parametrize("name", ["reset_partition_split", "reset_conns_split"])
def test_a_rule_that_trusted_a_reset_would_let_a_partition_split_the_job(name, monkeypatch):
    """The production Node under a resetting partition (a firewall that rejects with resets, a
    NAT that forgot its flows): with the rule as it is, one round at a time; with a rule that
    takes a reset as proof of death (as torch_mingle did), a round forms on half the votes
    (``quorum``), and two rounds train at once (``one-round``), whichever the swarm sees first."""
    case = next(r for r in REGRESSIONS["regressions"] if r["name"] == name)
    scenario = sc.Scenario.from_json(json.dumps(case["scenario"]))
    assert run(scenario).violation is None
    for seen in (Evidence.RESET, Evidence.CLOSED):
        monkeypatch.setitem(_evidence._VERDICTS, seen, Verdict(votes=False))
    outcome = run(scenario)
    assert outcome.violation is not None and outcome.violation.invariant in ("quorum", "one-round"), outcome


@pytest.mark.parametrize("oneway", [False, True], ids=["both-ways", "one-way"])
def test_a_partition_that_closes_with_a_fin_proves_nothing_either(oneway, monkeypatch):
    """A proxy, sidecar or NAT on the path that closes both ends of what it cannot route (the
    simulator's ``FIN`` cut): a 2|2 split whose every connection ends in a clean close. With the
    rule as it is, the job waits for a majority; a rule that took a close as the peer's word
    forms a round on half the votes."""
    split = sc.Event(2.0, "partition", dur=8.0, args=("fin", oneway, [[2, 3], [0, 1]]))
    scenario = sc.Scenario(
        seed=7, hosts=4, min_nodes=1, max_nodes=4, secret=False, starts=(0.0,) * 4, events=(split,)
    )
    assert run(scenario).violation is None
    monkeypatch.setitem(_evidence._VERDICTS, Evidence.CLOSED, Verdict(votes=False))
    outcome = run(scenario)
    assert outcome.violation is not None and outcome.violation.invariant in ("quorum", "one-round"), outcome
