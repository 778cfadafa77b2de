"""The README stays short and every link in it and in docs/ leads somewhere.

The README is for the people who run the bot; everything else lives in docs/ pages it
links to. A moved section must not leave a link to a heading that is gone, so every
relative link must name an existing file and, with `#anchor`, a heading of that file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.pages import PAGES, README, ROOT, anchors, github_anchor, links

#: About 300 lines is the aim; past this the README is growing back into a manual.
README_MAX_LINES = 320
EXTERNAL = ("http://", "https://", "mailto:")


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_starts_with_the_two_commands() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:6]
    assert head[0] == "# Sonality Bot"
    assert head[2] == "```bash" and head[5] == "```"
    assert head[3].startswith("python3 scripts/run.py ")
    assert head[4].startswith("python3 scripts/test.py ")


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.split("#")[0]).resolve()
        for _, target in links(README)
        if not target.startswith(EXTERNAL)
    }
    pages = {page.resolve() for page in PAGES if page != README}
    assert pages <= linked, sorted(p.name for p in pages - linked)


def _relative_links() -> list[tuple[Path, int, str]]:
    return [
        (page, line, target)
        for page in PAGES
        for line, target in links(page)
        if not target.startswith(EXTERNAL)
    ]


@pytest.mark.parametrize(
    ("page", "line", "target"),
    _relative_links(),
    ids=lambda value: value.name if isinstance(value, Path) else str(value),
)
def test_every_relative_link_resolves(page: Path, line: int, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    where = f"{page.relative_to(ROOT)}:{line}: {target}"
    assert file.is_relative_to(ROOT) and file.exists(), f"{where}: no such file"
    if anchor:
        assert file.suffix == ".md", f"{where}: an anchor into a file that is not a page"
        assert anchor in anchors(file), f"{where}: no heading with that anchor"


def test_there_are_links_to_check() -> None:
    targets = [target for _, _, target in _relative_links()]
    assert len(targets) > 40
    assert any("#" in t and not t.startswith("#") for t in targets), "cross-page anchors"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "Forgetting a member: `/sonality forget-me`, `/sonality forget-user`",
            "forgetting-a-member-sonality-forget-me-sonality-forget-user",
        ),
        ("5. Cost per message", "5-cost-per-message"),
        (
            "Which model does what, and what a message costs",
            "which-model-does-what-and-what-a-message-costs",
        ),
        (
            "Starting it with Docker: `docker-compose.scale.yml`",
            "starting-it-with-docker-docker-composescaleyml",
        ),
    ],
)
def test_anchors_are_made_as_github_makes_them(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_a_heading_in_a_code_block_is_no_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n```env\n# not a heading\n```\n\n## Title\n")
    assert anchors(page) == {"title", "title-1"}
