"""``_jobview``: what ``torch-mingle status`` shows, read from a leader's round book."""

from __future__ import annotations

from torch_mingle._jobview import Chronicle, job_view, render
from torch_mingle._records import Round, node_hex


def _round(number: int, members: tuple[int, ...]) -> Round:
    return Round(
        number=number, epoch=1, members=members, store_ip="198.18.0.1", store_port=5000,
        ips=tuple(f"198.18.0.{m}" for m in members),
    )  # fmt: skip


def test_the_chronicle_says_who_was_lost_who_left_and_who_joined():
    story = Chronicle()
    one = _round(1, (1, 2, 3))
    story.lost(one, 2, "connection reset", 5.0)
    story.lost(one, 9, "not a member", 5.0)  # not in the round: nothing to tell
    story.left(one, 3, 6.0)
    story.formed(_round(2, (1, 4)), one, 7.0)
    assert [what for _, what in story.lines] == [
        f"round 1: node {node_hex(2)} lost (connection reset)",
        f"round 1: node {node_hex(3)} left the job",
        f"round 2 formed, 2 node(s) after round 1: joined {node_hex(4)}; "
        f"without {node_hex(2)}, {node_hex(3)}",
    ]


def test_a_view_lists_members_by_rank_and_renders_as_a_table():
    from torch_mingle._rounds import RoundBook
    from torch_mingle._settings import RoundRules

    book = RoundBook(leader=1, epoch=1, rules=RoundRules(min_nodes=2, max_nodes=3, last_call_timeout_s=1.0))
    rnd = _round(1, (1, 2, 3))
    book.formed(rnd, 10.0)
    view = job_view(book, 1, "198.18.0.1", 12.5)
    assert [(m["rank"], m["node"], m["ip"]) for m in view["members"]] == [
        (0, node_hex(1), "198.18.0.1"),
        (1, node_hex(2), "198.18.0.2"),
        (2, node_hex(3), "198.18.0.3"),
    ]
    assert (view["state"], view["round"], view["round_age_s"]) == ("running", 1, 2.5)
    text = render("job42", view)
    assert text.startswith("job job42: running, epoch 1") and "formed 2.5s ago" in text
    assert f"{node_hex(3)}  198.18.0.3" in text
