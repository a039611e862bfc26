"""The transcripts of tests/transcripts: each command's output as the simulator prints it now.

A difference fails with both texts; ``MINGLE_REWRITE=1 make unit`` writes the new output into
the files instead (read the diff before committing it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_mingle.testing.transcript import TranscriptError, check, rewrite_wanted

FILES = sorted((Path(__file__).parent.parent / "transcripts").glob("*.txt"))


def test_there_are_transcripts():
    assert len(FILES) >= 12, [f.name for f in FILES]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_transcript(path: Path):
    want = path.read_text()
    got = check(path)
    if rewrite_wanted():
        path.write_text(got)
        return
    assert got == want, f"{path.name} reads differently now (MINGLE_REWRITE=1 rewrites it)"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kill 0\n----\n", "no job yet"),
        ("start 2\n----\n\nexplode 1\n----\n", "unknown command 'explode'"),
        ("start 2\n----\n\nkill 7\n----\n", "no host '7'"),
        ("start 2\n----\n\nrun soon\n----\n", "not a duration"),
        ("start 2\n", "followed by a line ----"),
    ],
)
def test_a_transcript_that_cannot_run_says_why(tmp_path: Path, text: str, says: str):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(TranscriptError, match=says):
        check(path)
