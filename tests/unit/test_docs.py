"""The docs check (``tests/docs_check.py``): the repository's docs pass it, and a broken copy of
them fails it with each problem named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import docs_check
from tests.helpers import ROOT


def test_the_docs_hold():
    problems = docs_check.check(ROOT)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Every wait, and its bound", "every-wait-and-its-bound"),
        ("Configuration (`--rdzv_conf key=value,...`)", "configuration---rdzv_conf-keyvalue"),
        (
            "Past 1,024, projected from the measured per-join costs",
            "past-1024-projected-from-the-measured-per-join-costs",
        ),
        ("torch's [rendezvous](x.md) events", "torchs-rendezvous-events"),
        ("The data path, checked before training", "the-data-path-checked-before-training"),
        ("`make bench-scale`: 64 to 1,024 nodes", "make-bench-scale-64-to-1024-nodes"),
    ],
)
def test_anchors_are_githubs(heading, anchor):
    assert docs_check.slug(heading) == anchor


def test_a_repeated_heading_gets_a_number_and_code_is_no_heading():
    page = "# Title\n## Usage\ntext\n## Usage\n```\n# not a heading\n```\n## Usage\n    # code too\n"
    assert docs_check.anchors(page) == {"title", "usage", "usage-1", "usage-2"}


def _copy(tmp_path: Path) -> Path:
    for name in ("README.md", "CHANGELOG.md", "Makefile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    # Links to files outside the docs (examples, benchmark results) must find them too.
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    shutil.copytree(ROOT / "tests" / "transcripts", tmp_path / "tests" / "transcripts")
    return tmp_path


def _row(readme: Path, key: str) -> str:
    """The configuration table's row of ``key``, its newline included."""
    return next(
        line for line in readme.read_text().splitlines(keepends=True) if line.startswith(f"| `{key}` |")
    )


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_a_broken_copy_of_the_docs_fails_with_each_problem(tmp_path):
    root = _copy(tmp_path)
    assert docs_check.check(root) == []  # the copy holds before it is broken

    readme, faults, networks = root / "README.md", root / "docs" / "faults.md", root / "docs" / "networks.md"
    # A link to a page that does not exist, and one to an anchor its page lacks.
    _edit(faults, "[Quorum](design.md#quorum)", "[Quorum](quorum.md)")
    _edit(readme, "(docs/benchmarks.md#scale)", "(docs/benchmarks.md#scaling)")
    # An anchor within the page that was renamed away, and an image that is not there.
    _edit(networks, "## doctor and ls", "## doctor, ls")
    _edit(root / "docs" / "benchmarks.md", "results/scale.png)", "results/scale-v2.png)")
    # The configuration table: a key dropped, a key the code lacks, a stale default, a default
    # shown for a key that has none.
    defaults = docs_check.config_defaults()
    port = int(str(defaults["port"]))
    _edit(readme, _row(readme, "ttl"), "")
    _edit(
        readme,
        _row(readme, "port"),
        f"| `port` | `{port + 1}` | UDP |\n| `intrface` | none | a typo |\n",
    )
    _edit(readme, _row(readme, "close_timeout"), "| `close_timeout` | `0.5` | seconds |\n")
    _edit(readme, _row(readme, "peers"), "| `peers` | `localhost` | hosts |\n")
    # A make target the Makefile lacks.
    _edit(root / "docs" / "benchmarks.md", "make bench-order ", "make bench-orders ")
    # The code names an anchor that no page has, and a page that does not exist.
    (root / "torch_mingle").mkdir()
    (root / "torch_mingle" / "errors.py").write_text(
        'HINT = "see docs/networks.md' + "#multicast-blocked" + '"\nMORE = "docs/tuning' + '.md"\n'
    )
    # A README that outgrew the front page.
    readme.write_text(readme.read_text() + "\n" * docs_check.MAX_README_LINES)

    found = "\n".join(map(str, docs_check.check(root)))

    expected = [
        "docs/faults.md:",
        "broken link quorum.md: no such file",
        "broken link docs/benchmarks.md#scaling: benchmarks.md has no heading with the anchor #scaling",
        "broken link #doctor-and-ls: networks.md has no heading with the anchor #doctor-and-ls",
        "broken link ../benchmarks/results/scale-v2.png: no such file",
        "configuration table lacks `ttl`",
        "configuration key `intrface` is not a key of MingleConfig",
        f"default of `port` shows `{port + 1}`, the code's default is `{port}`",
        f"default of `close_timeout` shows `0.5`, the code's default is `{defaults['close_timeout']}`",
        "default of `peers` shows '`localhost`', but it has no default value in the code",
        "`make bench-orders`: the Makefile has no such target",
        "torch_mingle/errors.py:1: reference to the docs: docs/networks.md#multicast-blocked",
        "torch_mingle/errors.py:2: reference to the docs: docs/tuning.md: no such file",
        f"README.md: {len(readme.read_text().splitlines())} lines, more than the front page's 250",
    ]
    missing = [needle for needle in expected if needle not in found]
    assert not missing, f"not reported: {missing}\nreported:\n{found}"


def test_the_check_runs_from_the_command_line(tmp_path, capsys):
    root = _copy(tmp_path)
    assert docs_check.main([str(root)]) == 0
    _edit(root / "README.md", "(docs/design.md)", "(docs/desing.md)")
    assert docs_check.main([str(root)]) == 1
    assert "docs/desing.md: no such file" in capsys.readouterr().out
