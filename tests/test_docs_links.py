"""Every relative link in README.md and docs/ leads somewhere: the file exists, and a ``#anchor``
is a heading of its target, slugged as GitHub slugs headings. README.md stays a front door.

Links are read outside code (fenced blocks and code spans), inline and as images:
``[text](path#anchor)``. External links (``http:``, ``https:``, ``mailto:``) are not fetched. A
heading's slug is GitHub's: its text as shown (links, code marks and emphasis dropped), lowercased,
every character that is not a letter, a digit, a space, ``-`` or ``_`` removed, each space a ``-``;
a heading seen before gets ``-1``, then ``-2``.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 170

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


# What a test or an example installs beside the docs (the Express compensator's npm packages) is
# not ours to check.
INSTALLED = {"node_modules", ".venv"}


def documents(root: Path = ROOT) -> list[Path]:
    ours = (
        path for path in (root / "docs").rglob("*.md") if not INSTALLED & set(path.relative_to(root).parts)
    )
    return [root / "README.md", *sorted(ours)]


def _without_code(text: str) -> str:
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML such as <kbd>
    text = "".join(ch for ch in text.lower() if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(paths: list[Path], root: Path = ROOT) -> list[str]:
    """One line per link that leads nowhere: the document, the link, and why."""
    headings: dict[Path, set[str]] = {}
    problems = []
    for path in paths:
        for target in LINK.findall(_without_code(path.read_text(encoding="utf-8"))):
            if target.startswith(EXTERNAL):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / unquote(file_part)).resolve() if file_part else path
            shown = linked.relative_to(root) if linked.is_relative_to(root) else linked
            where = f"{path.relative_to(root)}: ({target})"
            if not linked.exists():
                problems.append(f"{where}: no file {shown}")
                continue
            if not anchor or linked.suffix != ".md":
                continue
            if linked not in headings:
                headings[linked] = anchors(linked.read_text(encoding="utf-8"))
            if unquote(anchor) not in headings[linked]:
                problems.append(f"{where}: no heading #{anchor} in {shown}")
    return problems


def test_every_relative_link_in_the_docs_resolves() -> None:
    problems = broken_links(documents())
    assert not problems, "links that lead nowhere:\n" + "\n".join(problems)


def test_the_readme_is_a_front_door() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into docs/ and link it"
    )


def test_github_slugs() -> None:
    text = "# The docs\n## Where things are\n## Where things are\n### `ledger/`: the record\n"
    text += "## Security — in brief (issue-free)\n## [Linked](x.md) and **bold** <kbd>j</kbd>\n"
    text += "```\n# not a heading\n```\n## The demo under `make run`\n## foo_bar 1.5\n"
    assert anchors(text) == {
        "the-docs",
        "where-things-are",
        "where-things-are-1",
        "ledger-the-record",
        "security--in-brief-issue-free",
        "linked-and-bold-j",
        "the-demo-under-make-run",
        "foo_bar-15",
    }


def test_the_check_finds_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A\n\n## Kept heading\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[ok](docs/A.md#kept-heading) [self](#top) ![img](docs/A.md) [web](https://example.com/x)\n"
        "[gone](docs/GONE.md) [bad anchor](docs/A.md#lost-heading) `[in code](docs/NOPE.md)`\n\n"
        "```\n[in a block](docs/NOPE.md)\n```\n\n# Top\n",
        encoding="utf-8",
    )
    assert broken_links(documents(tmp_path), tmp_path) == [
        "README.md: (docs/GONE.md): no file docs/GONE.md",
        "README.md: (docs/A.md#lost-heading): no heading #lost-heading in docs/A.md",
    ]
