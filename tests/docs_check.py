"""The documentation check: a doc that lies fails the build.

``make test`` runs it (``tests/unit/test_docs.py``); ``python -m tests.docs_check`` runs it alone.
It reads README.md, CHANGELOG.md and every page under docs/, needs no network, and reports:

* a relative link or image whose file does not exist, or whose anchor names no heading of the
  page it points at (GitHub's anchors: lowercase, punctuation dropped, spaces to ``-``, a repeated
  heading gets ``-1``, ``-2``, ...); links with a scheme (``https:``) are not followed;
* a reference to a page or an anchor in the code (error messages, comments, docstrings under
  torch_mingle/, tests/, benchmarks/, examples/, and the packaging files) that does not resolve;
* a README configuration table that differs from ``MingleConfig``: a key of one missing from the
  other, or a default that is not the code's (a key whose default is ``None`` shows prose there,
  never a value in backticks);
* a ``make`` target named in the docs (in code, ``make bench-scale``) that the Makefile lacks;
* a README longer than the front page's budget, ``MAX_README_LINES``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_README_LINES = 250
README = "README.md"
CONFIG_HEADING = "configuration"
#: Where the code may name a page of the docs: these folders, and these files at the root.
CODE_DIRS = ("torch_mingle", "tests", "benchmarks", "examples")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".sbatch", ".sh", ".toml", ".cfg")
CODE_FILES = ("pyproject.toml", "setup.cfg", "Makefile")
#: This check and its test hold deliberately broken references; they are not scanned.
SELF = ("tests/docs_check.py", "tests/unit/test_docs.py")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_LINK_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML_REF = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
_HTML_ANCHOR = re.compile(r"""<a\s+(?:[^>]*\s)?(?:id|name)\s*=\s*["']([^"']+)["']""")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
_CODE_REF = re.compile(
    r"(?<![\w./-])(README\.md|README(?![\w.])|CHANGELOG\.md|docs/[\w./-]+?\.md)(?:#([\w-]+))?"
)
_MAKE = re.compile(r"^make\s+(\S+)")
_TARGET = re.compile(r"^([A-Za-z0-9_.-]+)\s*:(?!=)")


@dataclass(frozen=True)
class Problem:
    """One thing a doc says that is not so."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class Line:
    """A line of a Markdown file, with whether it is code (fenced or indented)."""

    number: int
    text: str
    code: bool


def doc_files(root: Path) -> list[Path]:
    """README.md, CHANGELOG.md and every Markdown page under docs/, those that exist."""
    files = [root / name for name in (README, "CHANGELOG.md") if (root / name).is_file()]
    docs = root / "docs"
    return files + (sorted(docs.rglob("*.md")) if docs.is_dir() else [])


def lines_of(text: str) -> list[Line]:
    """Split Markdown into lines and mark the code: fenced blocks, and indented blocks after a
    blank line (a list item's code sample is indented too, and is code)."""
    out = []
    fence: str | None = None
    indented = False
    previous_blank = True
    for number, line in enumerate(text.splitlines(), 1):
        blank = not line.strip()
        opened = _FENCE.match(line)
        if fence is not None:
            out.append(Line(number, line, True))
            if opened and opened.group(1) == fence:
                fence = None
        elif opened:
            fence = opened.group(1)
            out.append(Line(number, line, True))
        else:
            indent = len(line) - len(line.lstrip(" "))
            if not blank:
                indented = indent >= 4 and (indented or previous_blank)
            out.append(Line(number, line, indented and not blank))
        previous_blank = blank
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text, before duplicates are numbered."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has: its headings' (numbered as GitHub numbers repeats) and HTML ids."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in lines_of(text):
        if line.code:
            continue
        out.update(_HTML_ANCHOR.findall(line.text))
        heading = _HEADING.match(line.text)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def _prose(line: str) -> str:
    """The line with its code spans blanked (a link inside one is not a link)."""
    return _CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)


def _link_targets(line: str) -> Iterator[str]:
    prose = _prose(line)
    # A link's text may hold a code span: find links on the blanked line, read targets there.
    yield from _LINK.findall(prose)
    yield from _HTML_REF.findall(prose)
    definition = _LINK_DEF.match(prose)
    if definition:
        yield definition.group(1)


class _Pages:
    """Anchors of the Markdown files, read once each."""

    def __init__(self) -> None:
        self._anchors: dict[Path, set[str]] = {}

    def anchors(self, path: Path) -> set[str]:
        if path not in self._anchors:
            self._anchors[path] = anchors(path.read_text(encoding="utf-8"))
        return self._anchors[path]


def _resolve(root: Path, base: Path, target: str, pages: _Pages) -> str | None:
    """Why ``target`` (a path relative to ``base``, with an optional ``#anchor``) does not
    resolve, or None when it does."""
    path_part, _, anchor = target.partition("#")
    path = (base / path_part).resolve() if path_part else base
    try:
        path.relative_to(root.resolve())
    except ValueError:
        return f"{target} points outside the repository"
    if not path.exists():
        return f"{target}: no such file"
    if anchor and path.is_file() and path.suffix == ".md" and anchor not in pages.anchors(path):
        return f"{target}: {path.name} has no heading with the anchor #{anchor}"
    return None


def check_links(root: Path, pages: _Pages | None = None) -> list[Problem]:
    """Every relative link and image of the docs leads to a file, and to an anchor it has."""
    pages = pages or _Pages()
    problems = []
    for doc in doc_files(root):
        rel = doc.relative_to(root).as_posix()
        for line in lines_of(doc.read_text(encoding="utf-8")):
            if line.code:
                continue
            for target in _link_targets(line.text):
                if _SCHEME.match(target):
                    continue
                base = doc if target.startswith("#") else doc.parent
                why = _resolve(root, base, target, pages)
                if why:
                    problems.append(Problem(f"{rel}:{line.number}", f"broken link {why}"))
    return problems


def code_files(root: Path) -> list[Path]:
    """The files whose text may name a page of the docs."""
    files = [root / name for name in CODE_FILES if (root / name).is_file()]
    for folder in CODE_DIRS:
        if (root / folder).is_dir():
            files += sorted(
                p for p in (root / folder).rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES
            )
    return [p for p in files if p.relative_to(root).as_posix() not in SELF]


def check_code_references(root: Path, pages: _Pages | None = None) -> list[Problem]:
    """Every ``README.md#anchor``, ``docs/PAGE.md#anchor`` or ``docs/PAGE.md`` the code names
    resolves (paths are from the repository's root; ``README#anchor`` means README.md)."""
    pages = pages or _Pages()
    problems = []
    for path in code_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for page, anchor in _CODE_REF.findall(line):
                if page == "README" and not anchor:
                    continue  # prose: "the README"
                name = README if page == "README" else page
                target = f"{name}#{anchor}" if anchor else name
                why = _resolve(root, root, target, pages)
                if why:
                    problems.append(Problem(f"{rel}:{number}", f"reference to the docs: {why}"))
    return problems


def config_defaults() -> dict[str, object]:
    """Every ``--rdzv_conf`` key of ``MingleConfig`` and its default, read from the code."""
    from torch_mingle import config

    return {key: getattr(config.MingleConfig, key) for key in config.KNOWN_KEYS}


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def config_table(readme: str) -> dict[str, tuple[int, str]] | None:
    """The README's configuration table: key -> (line number, default cell); None if missing."""
    lines = lines_of(readme)
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if not line.code
            and (m := _HEADING.match(line.text)) is not None
            and slug(m.group(2)) == CONFIG_HEADING
        ),
        None,
    )
    if start is None:
        return None
    table: dict[str, tuple[int, str]] = {}
    header: list[str] | None = None
    for line in lines[start + 1 :]:
        if _HEADING.match(line.text) and not line.code:
            break
        if not line.text.lstrip().startswith("|"):
            if header is not None and table:
                break
            continue
        cells = _cells(line.text)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if all(set(c) <= set(":- ") for c in cells):
            continue  # the delimiter row
        row = dict(zip(header, cells, strict=False))
        key = row.get("key", "").strip("`")
        table[key] = (line.number, row.get("default", ""))
    if header is None or "key" not in header or "default" not in header:
        return None
    return table


def _default_error(cell: str, value: object) -> str | None:
    """Why a table's default cell does not show ``value``, or None when it does."""
    shown = _CODE_SPAN.findall(cell)
    if value is None:
        return f"shows {cell!r}, but it has no default value in the code (None)" if shown else None
    if len(shown) != 1:
        return f"shows {cell!r}, not the code's default `{value}` in backticks"
    text = shown[0][1].strip()
    if isinstance(value, bool) or not isinstance(value, int | float):
        same = text == str(value)
    else:
        try:
            same = float(text) == float(value)
        except ValueError:
            same = False
    return None if same else f"shows `{text}`, the code's default is `{value}`"


def check_config(root: Path, defaults: Mapping[str, object] | None = None) -> list[Problem]:
    """The README's configuration table has every key of ``MingleConfig``, no other, and the
    code's defaults."""
    defaults = config_defaults() if defaults is None else defaults
    readme = root / README
    table = config_table(readme.read_text(encoding="utf-8")) if readme.is_file() else None
    if table is None:
        return [
            Problem(
                README,
                "no configuration table (a `key | default | meaning` table under a 'Configuration' heading)",
            )
        ]
    problems = []
    for key, (number, _) in table.items():
        if key not in defaults:
            problems.append(
                Problem(
                    f"{README}:{number}",
                    f"configuration key `{key}` is not a key of MingleConfig (torch_mingle/config.py)",
                )
            )
    for key, value in defaults.items():
        if key not in table:
            problems.append(
                Problem(
                    README, f"configuration table lacks `{key}`, a key of MingleConfig (default {value!r})"
                )
            )
            continue
        number, cell = table[key]
        why = _default_error(cell, value)
        if why:
            problems.append(Problem(f"{README}:{number}", f"default of `{key}` {why}"))
    return problems


def make_targets(makefile: Path) -> set[str]:
    """The targets the Makefile defines."""
    if not makefile.is_file():
        return set()
    targets = set()
    for line in makefile.read_text(encoding="utf-8").splitlines():
        match = _TARGET.match(line)
        if match:
            targets.add(match.group(1))
    return targets


def _make_mentions(line: Line) -> Iterator[str]:
    if line.code:
        match = _MAKE.match(line.text.strip())
        if match:
            yield match.group(1)
    for _, span in _CODE_SPAN.findall(line.text):
        match = _MAKE.match(span.strip())
        if match:
            yield match.group(1)


def check_make_targets(root: Path) -> list[Problem]:
    """Every ``make TARGET`` the docs show in code exists in the Makefile."""
    targets = make_targets(root / "Makefile")
    problems = []
    for doc in doc_files(root):
        rel = doc.relative_to(root).as_posix()
        for line in lines_of(doc.read_text(encoding="utf-8")):
            for target in _make_mentions(line):
                if target.startswith("-") or "=" in target:
                    continue
                if target not in targets:
                    problems.append(
                        Problem(f"{rel}:{line.number}", f"`make {target}`: the Makefile has no such target")
                    )
    return problems


def check_readme_length(root: Path) -> list[Problem]:
    """The README stays a front page."""
    readme = root / README
    if not readme.is_file():
        return [Problem(README, "missing")]
    count = len(readme.read_text(encoding="utf-8").splitlines())
    if count > MAX_README_LINES:
        return [
            Problem(
                README,
                f"{count} lines, more than the front page's {MAX_README_LINES}: "
                "move the detail to a page under docs/",
            )
        ]
    return []


def check(root: Path = ROOT, defaults: Mapping[str, object] | None = None) -> list[Problem]:
    """Every problem of the docs under ``root``."""
    pages = _Pages()
    return [
        *check_readme_length(root),
        *check_links(root, pages),
        *check_code_references(root, pages),
        *check_config(root, defaults),
        *check_make_targets(root),
    ]


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else ROOT
    problems = check(root)
    for problem in problems:
        print(problem)
    print(f"docs check: {len(problems)} problem(s)" if problems else "docs check: the docs hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
