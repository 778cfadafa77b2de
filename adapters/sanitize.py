"""What a platform hands over, made safe to pass on: valid text and bounded names.

Why at the adapter edge: Discord and Slack deliver JSON, and JSON may carry a lone
surrogate escape (`"\\ud800"`) that Python's `json` turns into a string no UTF-8
encoder accepts. Passed on, it fails far away and late (the SQLite binding, the LLM
SDK's request body, a log handler), as an internal error or worse. Names are shown in
history, audit lines and prompts, so one of a thousand characters, or one that carries
control characters, must not reach them as it came. Nor one that is markdown: answers
are sent as markdown (Discord), so a name such as `[Vote here](https://evil.example)`
would show in a public answer as a link under words of its author's choosing; a name's
square brackets become round ones (`(TAG) Player` still reads as the clan tag it was).
Message length is not cut here: the runtime cuts long messages and tells the member it
did.
"""

from __future__ import annotations

import unicodedata

#: Longest member name passed on (the terminal's `/as` cuts at the same length).
MAX_NAME_CHARS = 64
#: Longest community name passed on (Discord allows 100 for a guild).
MAX_COMMUNITY_NAME_CHARS = 100
#: Longest slash-command text passed on; arguments are a version, a topic or a reason.
MAX_COMMAND_CHARS = 1000

_ZERO_WIDTH_JOINER = "\u200d"  # holds multi-part emoji together, so names keep it
#: A masked link is `[words](address)`: without square brackets a name cannot open one.
_NO_LINKS = str.maketrans("[]", "()")


def clean_text(text: str) -> str:
    """`text` as valid Unicode, lines kept: each lone surrogate becomes U+FFFD (a
    correctly paired one becomes its character), carriage returns and other control
    characters except newline and tab are dropped."""
    # UTF-16 round trip: surrogatepass writes every surrogate as it is, and decoding
    # pairs the ones that form a character and replaces the ones that do not.
    valid = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return "".join(c for c in valid if c in "\n\t" or unicodedata.category(c) != "Cc")


def clean_name(raw: str, limit: int = MAX_NAME_CHARS) -> str:
    """A display name: valid, printable (no control or invisible formatting characters,
    which could reorder how a history line reads), unable to form a markdown link (square
    brackets become round ones), single-spaced, at most `limit` characters."""
    printable = "".join(
        c
        for c in clean_text(raw)
        if c == _ZERO_WIDTH_JOINER or unicodedata.category(c) not in ("Cc", "Cf")
    )
    return " ".join(printable.translate(_NO_LINKS).split())[:limit].strip()


def clean_command(text: str) -> str:
    """Slash-command text or an option value: valid and at most MAX_COMMAND_CHARS."""
    return clean_text(text)[:MAX_COMMAND_CHARS]
