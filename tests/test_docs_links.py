"""Every relative link of README.md and docs/*.md leads somewhere: the file exists, and a
`#section` names a heading of it (by GitHub's rule for heading anchors), so renaming or
dropping a heading cannot silently break the links to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def anchor_of(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, without what is not a letter, digit, space, `-` or `_`, spaces as `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors_of(markdown: str) -> set[str]:
    """The anchors of every heading outside code blocks, with GitHub's `-1`, `-2` for repeated ones."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        anchor = anchor_of(heading)
        anchors.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def links_of(markdown: str) -> list[str]:
    """The link targets outside code blocks and inline code."""
    return LINK.findall(INLINE_CODE.sub("", FENCE.sub("", markdown)))


def test_anchors_follow_githubs_rule():
    assert anchor_of("The IMDB hour on a Zen 5: 1.7 times the steps, the same `tiny`") == "the-imdb-hour-on-a-zen-5-17-times-the-steps-the-same-tiny"
    assert anchor_of("Windows the length of the pretraining blocks") == "windows-the-length-of-the-pretraining-blocks"
    assert anchors_of("# A\n```bash\n# not a heading\n```\n## A\n### b c") == {"a", "a-1", "b-c"}
    assert links_of("[x](a.md#b) `[y](c.md)`\n```\n[z](d.md)\n```") == ["a.md#b"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_relative_links_lead_to_a_file_and_a_heading(document):
    broken = []
    for target in links_of(document.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors_of(file.read_text()):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {file.name}")
    assert not broken, f"{document.name}: " + "; ".join(broken)
