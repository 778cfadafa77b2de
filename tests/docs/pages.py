"""Reading the README and docs/ pages as a newcomer meets them: the shell commands they
show, the links they give, and the headings those links point at.

Why a small reader of our own rather than a Markdown library: the pages use a handful of
constructs (fenced blocks, inline code, links, `#` headings), and what matters here is
exactly what a person copies: a fenced shell block line by line, an inline command as
written, and GitHub's rule for turning a heading into an anchor.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))

#: Fenced blocks whose lines are typed into a shell.
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*```(\S*)\s*$")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
#: What a command that starts one of the project's programs begins with.
COMMAND_STARTS = ("python3 ", "python ", ".venv/bin/", "docker ", "sudo ")
#: Shell words that end one command and start the next.
SEPARATORS = {"&&", "||", ";", "|"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    """One simple command as a person would type it, and where it was shown."""

    page: Path
    line: int
    words: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {shlex.join(self.words)}"


def text_lines(page: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line number, line, language of the fenced block it is in, or None outside)."""
    language: str | None = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            language = (fence.group(1) or "text") if language is None else None
            continue
        yield number, line, language


def substitutions(word: str) -> Iterator[str]:
    """The commands inside `$( … )` in a word (`"KEY=$(python3 -c '…')"`)."""
    start = word.find("$(")
    while start != -1:
        depth, end = 0, start + 1
        for end in range(start + 1, len(word)):
            depth += {"(": 1, ")": -1}.get(word[end], 0)
            if depth == 0:
                break
        yield word[start + 2 : end]
        start = word.find("$(", end)


def _simple_commands(page: Path, number: int, line: str) -> Iterator[Command]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for word in [*lexer, ";"]:
        if word in SEPARATORS or set(word) <= set(";&|"):
            if words:
                yield Command(page, number, tuple(words))
            words = []
        else:
            for inner in substitutions(word):
                yield from _simple_commands(page, number, inner)
            words.append(word)


def shell_commands(page: Path) -> Iterator[Command]:
    """Every simple command of the page's shell blocks (continued lines joined)."""
    pending, start = "", 0
    for number, line, language in text_lines(page):
        if language not in SHELL_LANGUAGES:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield from _simple_commands(page, start, pending + line)
        pending = ""


def inline_commands(page: Path) -> Iterator[Command]:
    """Inline code outside fenced blocks that starts one of the project's programs."""
    for number, line, language in text_lines(page):
        if language is not None:
            continue
        for match in INLINE_CODE.finditer(line):
            code = match.group(1).strip()
            bare = " ".join(w for w in code.split() if not ASSIGNMENT.match(w))
            if bare.startswith(COMMAND_STARTS) or bare in ("python", "python3"):
                yield from _simple_commands(page, number, code)


def commands(page: Path) -> list[Command]:
    return [*shell_commands(page), *inline_commands(page)]


def program_words(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words after `sudo -u USER`, `env` and `NAME=value` prefixes."""
    rest = list(words)
    while rest:
        if rest[0] == "sudo":
            rest = rest[3:] if rest[1:2] == ["-u"] else rest[1:]
        elif rest[0] in ("env", "export") or ASSIGNMENT.match(rest[0]):
            rest = rest[1:]
        else:
            break
    return tuple(rest)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: formatting dropped, lower case, punctuation
    other than `-` and `_` removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2 as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line, language in text_lines(page):
        heading = HEADING.match(line) if language is None else None
        if not heading:
            continue
        anchor = github_anchor(heading.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def links(page: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every link and image outside code."""
    for number, line, language in text_lines(page):
        if language is not None:
            continue
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            yield number, match.group(1)
