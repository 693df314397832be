"""Every relative link of the front pages and of docs/ leads somewhere: a link in
README.md, CONTRIBUTING.md, bench/README.md or docs/*.md resolves to a file or a
directory of the repository, and its `#anchor`, when it points into a Markdown file,
names a heading of that file (GitHub's slugs). External links (http, https, mailto) are
not followed: a test must not need the network.

Links inside fenced code blocks and inline code spans are text, not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

FRONT_PAGES = ("README.md", "CONTRIBUTING.md", "bench/README.md")
PAGES = sorted([*(REPO / name for name in FRONT_PAGES), *(REPO / "docs").glob("*.md")])
EXTERNAL = ("http://", "https://", "mailto:")

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the target up to the first space or ")" (a title
# may follow the space), or <...> for a target holding spaces.
_INLINE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*(<[^>]*>|[^)\s]+)[^)]*\)")
# [label]: target
_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1) == fence:
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        lines.append((number, line))
    return lines


def links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every link in ``text``."""
    found: list[tuple[int, str]] = []
    for number, raw in _prose_lines(text):
        line = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), raw)
        targets = [m.group(1) for m in _INLINE.finditer(line)]
        definition = _DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
        found += [(number, t.removeprefix("<").removesuffix(">")) for t in targets]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and
    underscores kept), spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a Markdown file's headings; repeats get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(text):
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, repo: Path) -> list[str]:
    """What is wrong with each relative link of ``page``, as ``page:line: target: why``."""
    problems: list[str] = []
    name = page.relative_to(repo)
    for number, target in links(page.read_text()):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        where = f"{name}:{number}: {target}"
        if not resolved.is_relative_to(repo.resolve()):
            problems.append(f"{where}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{where}: no such file or directory")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(repo)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, REPO) == []


def test_the_pages_checked_include_the_front_door_and_docs() -> None:
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert {"README.md", "CONTRIBUTING.md", "bench/README.md", "docs/api.md"} <= names


def test_a_broken_link_or_anchor_is_reported_and_code_is_not_a_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Set up: the `thing` (twice)\n")
    (tmp_path / "pkg").mkdir()
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n"
        "[fine](docs/page.md) [dir](pkg) [here](#title) "
        "[heading](docs/page.md#set-up-the-thing-twice) [web](https://example.com/x)\n"
        "[gone](docs/missing.md) ![img](docs/missing.png)\n"
        "[bad anchor](docs/page.md#no-such-heading) [escape](../outside.md)\n"
        "`[in code](docs/missing-too.md)`\n"
        "```\n[in a fence](docs/missing-three.md)\n```\n"
        "[label]: docs/nowhere.md\n"
    )
    found = broken_links(page, tmp_path)
    assert [p.split(": ", 1)[0].split(":", 1)[1] for p in found] == ["4", "4", "5", "5", "10"]
    assert [p.split(": ")[1] for p in found] == [
        "docs/missing.md",
        "docs/missing.png",
        "docs/page.md#no-such-heading",
        "../outside.md",
        "docs/nowhere.md",
    ]
