"""Every relative link in README.md and docs/*.md points at a file that exists, and every ``#anchor`` at a heading
of the page it names (GitHub's heading ids). Links inside code (fenced blocks, inline code) are not links."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def heading_ids(text: str) -> set[str]:
    """The ids GitHub gives a page's headings: lower case, punctuation dropped, spaces to ``-``, repeats ``-1``, ..."""
    ids: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in ids:
            n += 1
            candidate = f"{slug}-{n}"
        ids.add(candidate)
    return ids


def broken_links(page: Path, root: Path = ROOT) -> tuple[int, list[str]]:
    """How many relative links ``page`` (a file under ``root``) holds, and a line for each one that does not
    resolve."""
    text = page.read_text(encoding="utf-8")
    found, problems = 0, []
    for number, line in _prose_lines(text):
        targets = [m.group(1) for m in LINK.finditer(line)]
        targets += [m.group(1) for m in REFERENCE_DEFINITION.finditer(line)]
        for target in targets:
            if EXTERNAL.match(target):
                continue
            found += 1
            path_part, _, anchor = target.partition("#")
            where = f"{page.relative_to(root)}:{number}: ({target})"
            resolved = (page.parent / path_part).resolve() if path_part else page
            if not resolved.exists():
                problems.append(f"{where} no such file {os.path.relpath(resolved, root)}")
            elif anchor and resolved.suffix == ".md" and anchor not in heading_ids(resolved.read_text("utf-8")):
                problems.append(f"{where} {resolved.name} has no heading with id '{anchor}'")
            elif anchor and resolved.suffix != ".md":
                problems.append(f"{where} an anchor into a file that is not a markdown page")
    return found, problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    _, problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_the_pages_are_checked_at_all():
    """The README and the docs link to each other: a checker that finds no links is broken, not passing."""
    counts = {page.name: broken_links(page)[0] for page in PAGES}
    assert counts["README.md"] >= 20 and sum(counts.values()) >= 40, counts


def test_the_checker_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title `x`\n\n## Two words\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#two-words-1) [ok](docs/a.md#title-x) [ok](#top) `[code](nope.md)`\n"
        "```\n[fenced](nope.md)\n```\n[gone](docs/b.md) [bad anchor](docs/a.md#three) [web](https://x.org/y.md)\n"
        "# Top\n"
    )
    found, problems = broken_links(page, tmp_path)
    assert found == 5
    assert len(problems) == 2 and "docs/b.md" in problems[0] and "'three'" in problems[1], problems


def test_the_docs_index_lists_every_page_once():
    """docs/README.md is the index a newcomer reads: each page of docs/ on one line of its own."""
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^- \[[^\]]+\]\(([^)#]+\.md)\)", index, re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(listed) == pages, f"docs/README.md lists {sorted(listed)}; docs/ has {pages}"
    assert "docs/README.md" in (ROOT / "README.md").read_text(encoding="utf-8"), "the README links to the index"
