"""Split a long reply into platform-sized messages without breaking its markdown.

Discord caps a message at 2,000 characters and Slack's blocks have their own caps;
an answer longer than that must arrive as several messages that each still render
correctly. The main hazard is a fenced code block (```lang) cut in half: the second
half would render as prose and every later fence would flip meaning. So a block that
has to be split is closed at the end of one chunk and reopened (same language) at the
start of the next, and those added characters count against the limit.
"""

from __future__ import annotations

import re

__all__ = ["split_message"]

FENCE = "```"
_CLOSE = "\n" + FENCE
_LANG = re.compile(r"[A-Za-z0-9_+#.\-]*")
_FENCE_TOKEN = re.compile(FENCE + _LANG.pattern)
# Below this a reopened fence plus its closing would eat the whole chunk; such tiny
# limits only happen in tests, and there plain splitting is the honest answer.
_MIN_LIMIT_FOR_FENCES = 16


def split_message(text: str, limit: int) -> list[str]:
    """Split `text` into chunks of at most `limit` characters.

    Cuts prefer a paragraph break, then a line break, then a space; only a single word
    longer than the room left is cut mid-word. The whitespace at a cut is dropped (it
    would be invisible at a message edge anyway), nothing else is. Returns [] for
    blank text so callers never try to send an empty message.
    """
    if limit < 1:
        raise ValueError("limit must be positive")
    if not text.strip():
        return []
    fences = limit >= _MIN_LIMIT_FOR_FENCES
    events = _fence_events(text) if fences else []
    if len(text) <= limit and (not events or events[-1][1] is None):
        return [text]

    chunks: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        opener = _state_at(events, pos)
        prefix = opener + "\n" if opener else ""
        if opener and len(prefix) + len(_CLOSE) + 8 > limit:
            # A pathological info string: reopen as a bare fence instead.
            prefix = FENCE + "\n"
        room = limit - len(prefix)
        cut, nxt = _find_cut(text, pos, room, events)
        if _state_at(events, cut) is not None and (cut - pos) + len(_CLOSE) > room:
            cut, nxt = _find_cut(text, pos, room - len(_CLOSE), events)
        body = text[pos:cut]
        suffix = _CLOSE if _state_at(events, cut) is not None else ""
        if suffix and text.startswith(FENCE, nxt) and _state_at(events, nxt + 3) is None:
            # The block's own closing fence starts the next chunk: the fence we add
            # replaces it, instead of reopening an empty block there.
            nxt += 3
            if text.startswith("\n", nxt):
                nxt += 1
        # A body of only fence markers (cut right after an opener) would render as an
        # empty code block; the fence state lives in the text positions, so skipping
        # it loses nothing: the next chunk reopens the block itself.
        if (_FENCE_TOKEN.sub("", body) if fences else body).strip():
            chunks.append(prefix + body + suffix)
        pos = nxt
    return chunks


def _fence_events(text: str) -> list[tuple[int, str | None]]:
    """Every ``` run with the fence state after it: the opener (e.g. "```py") or None.

    Parity of ``` runs is what a renderer (and a reader) uses to decide whether a
    position is inside code, so a run anywhere on a line toggles the state; the
    language is remembered so a reopened block keeps its highlighting.
    """
    events: list[tuple[int, str | None]] = []
    state: str | None = None
    i = text.find(FENCE)
    while i != -1:
        if state is None:
            end = text.find("\n", i + 3)
            rest_of_line = text[i + 3 : end if end != -1 else len(text)]
            lang = _LANG.fullmatch(rest_of_line.strip())
            state = FENCE + (lang.group(0) if lang else "")
        else:
            state = None
        events.append((i, state))
        i = text.find(FENCE, i + 3)
    return events


def _state_at(events: list[tuple[int, str | None]], pos: int) -> str | None:
    """Fence state just before `pos` (cuts never fall inside a ``` run)."""
    state: str | None = None
    for start, after in events:
        if start + 3 > pos:
            break
        state = after
    return state


def _find_cut(
    text: str, pos: int, room: int, events: list[tuple[int, str | None]]
) -> tuple[int, int]:
    """Best cut for a chunk starting at `pos` with `room` characters: (end, next start)."""
    room = max(room, 1)
    n = len(text)
    limit_end = pos + room
    if n <= limit_end:
        return n, n
    # Paragraph, then line, then word: the separator itself may lie past the window
    # because it is dropped.
    i = text.rfind("\n\n", pos + 1, limit_end + 2)
    if i != -1:
        nxt = i
        while nxt < n and text[nxt] == "\n":
            nxt += 1
        return i, nxt
    for sep in ("\n", " ", "\t"):
        i = text.rfind(sep, pos + 1, limit_end + 1)
        if i != -1:
            return i, i + 1
    # One word longer than the room: hard cut, but never through a ``` run, which
    # would leave a stray backtick pair on each side.
    cut = limit_end
    for start, _ in events:
        if start < cut < start + 3:
            cut = start if start > pos else start + 3
            break
    return cut, cut
