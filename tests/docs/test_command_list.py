"""The command tables of the README and docs/using.md list what the command table
(bot/command_table.py) defines: the same commands, each with the same parameters, and
the same ones marked as moderators' only. `/sonality help` is made from the same table
(tests/adapters/test_command_surfaces.py checks it with Discord and Slack).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot import command_table
from tests.docs.pages import README, ROOT, text_lines

USING = ROOT / "docs" / "using.md"
#: A command's name and its parameters: `history [all] [count]`, `budget <usd>|off|default`.
SIGNATURE = re.compile(r"^[a-z][a-z-]*(?: (?:\[[^\]]+\]|<[^>]+>(?:\|[a-z]+)*))*")

Entry = tuple[str, bool]  # (signature, moderators only)


def help_entries() -> set[Entry]:
    entries: set[Entry] = set()
    for usage, what in command_table.help_entries():
        match = SIGNATURE.fullmatch(usage)
        assert match, usage
        entries.add((usage, what.startswith("moderators:")))
    return entries


def table_entries(page: Path) -> set[Entry]:
    """The rows of the page's command table: | `signature` | who | what |."""
    entries: set[Entry] = set()
    for _, line, language in text_lines(page):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if language is None and len(cells) == 3 and cells[1] in ("everyone", "moderators"):
            signature = cells[0].strip("`").replace("\\|", "|")
            entries.add((signature, cells[1] == "moderators"))
    return entries


def test_help_lists_every_command_with_its_parameters() -> None:
    entries = help_entries()
    assert ("history [all] [count]", False) in entries
    assert ("budget <usd>|off|default", True) in entries
    assert ("forget-user <member> <reason>", True) in entries
    assert len(entries) == 15  # 14 commands; `budget` with and without a limit


@pytest.mark.parametrize("page", [README, USING], ids=lambda p: p.name)
def test_the_page_lists_the_commands_help_lists(page: Path) -> None:
    shown, helped = table_entries(page), help_entries()
    assert shown == helped, (
        f"only in {page.name}: {sorted(shown - helped)}; "
        f"only in the table: {sorted(helped - shown)}"
    )


def test_a_table_that_drifted_from_help_is_caught(tmp_path: Path) -> None:
    """A row missing its parameters, or a moderator rule lost, is a difference."""
    page = tmp_path / "page.md"
    rows = [
        f"| `{sig.replace('|', chr(92) + '|')}` | {'moderators' if mod else 'everyone'} | x |"
        for sig, mod in sorted(help_entries())
    ]
    page.write_text("| command | who | what |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")
    assert table_entries(page) == help_entries()
    page.write_text(page.read_text().replace("`history [all] [count]`", "`history`"))
    assert ("history", False) in table_entries(page) - help_entries()
    page.write_text(
        page.read_text().replace("| `reflect` | moderators |", "| `reflect` | everyone |")
    )
    assert ("reflect", True) in help_entries() - table_entries(page)
