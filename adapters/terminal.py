"""A local community in the terminal: the embedded default platform.

It exists so anyone with an API key can watch the personality work without a Discord
or Slack app: chat as several people (`/as NAME`), then inspect or roll back with the
same `/sonality` commands moderators use (the terminal user is a moderator, and is not
flood-limited: the operator is not a member the bot needs protecting from).

Two ways of reading input:

- At a terminal (stdin and stdout both TTYs), prompt_toolkit's `PromptSession`: the
  arrow keys edit the line, Up and Down walk a history kept in the data directory, and
  Ctrl-C / Ctrl-D leave. Why prompt_toolkit rather than `readline`: `prompt_async`
  runs on the bot's own event loop, so the learning, the scheduler and the platforms
  keep running while the operator types, and it restores the terminal when the bot is
  stopped mid-prompt. `readline` only edits inside a blocking `input()`, which would
  need a thread that cannot be interrupted (Ctrl-C would wait for Enter), and it is
  missing from some Python builds altogether.
- Otherwise (scripted), one message per line in and exactly ONE line out per input
  line, command output included, newlines written as a literal `\\n`; the status line
  goes to stderr.

Input is untrusted even here: bytes that are not UTF-8 are replaced rather than passed
on (they would fail later, in JSON or SQLite), and names are cleaned and cut, so a bad
line gets a short answer and the bot keeps running.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import shutil
import sys
import threading
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from rich.cells import cell_len

from bot.command_table import command, split_command
from bot.interface import ChatRuntime
from bot.messages import (
    INTERNAL_ERROR,
    MY_DATA_FILE_PREFIX,
    TIMELINE_FILE_PREFIX,
    Attachment,
    CommandRequest,
    CommandResult,
    Community,
    IncomingMessage,
    Reply,
    ReplyKind,
    User,
)
from bot.settings import Settings

log = logging.getLogger(__name__)

COMMUNITY = Community(id="terminal:local", name="terminal")
#: The terminal community's one channel (its mode is set like any other's).
CHANNEL = "terminal"
BANNER = (
    "Sonality terminal community. Type a message and press Enter.\n"
    "  /as NAME              speak as someone else\n"
    "  /sonality help        moderator commands (you are a moderator here)\n"
    "  //text                send a message that starts with /\n"
    "  /quit                 leave (Ctrl-D works too)"
)
#: Longest name `/as` accepts; longer ones are cut (platform names are about this long).
MAX_NAME_CHARS = 64
HISTORY_FILE = "terminal_history"
# A first word like `/foo` or `/sonalty` is a command; `/r/python` or `/ 2` is not.
COMMAND_WORD = re.compile(r"/[A-Za-z][\w-]*")
UNKNOWN_COMMAND = "unknown command {word}, try /sonality help"


class TerminalAdapter:
    name = "terminal"

    def __init__(
        self,
        runtime: ChatRuntime,
        settings: Settings,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.runtime = runtime
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        if isinstance(self.stdout, io.TextIOWrapper):
            # A character the terminal's encoding lacks becomes "?", not a traceback.
            self.stdout.reconfigure(errors="replace")
        name = clean_name(settings.terminal_user) or "you"
        self.user = User(id=_user_id(name), name=name)
        self.interactive = self.stdin.isatty()
        # Line editing needs a terminal on both ends; with output piped, plain lines.
        self.editing = self.interactive and self.stdout.isatty()
        self.history_path = settings.data_dir / HISTORY_FILE
        self.data_dir = settings.data_dir
        self._closed = False
        self._history_cleared = False

    async def start(self) -> None:
        if self.interactive:
            self._print(BANNER)
        if self.editing:
            await self._edit_lines()
        else:
            await self._plain_lines()

    async def _edit_lines(self) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.input import create_input
        from prompt_toolkit.output import create_output

        terminal_in, terminal_out = create_input(self.stdin), create_output(self.stdout)

        def new_session() -> PromptSession[str]:
            return PromptSession(
                history=FileHistory(str(_private_file(self.history_path))),
                input=terminal_in,
                output=terminal_out,
            )

        session = new_session()
        while not self._closed:
            if self._history_cleared:  # a forget emptied the file: Up must not recall it
                session, self._history_cleared = new_session(), False
            try:
                line = await session.prompt_async(
                    f"{self.user.name}> ",
                    # SIGINT from outside stops the bot through its own handler; Ctrl-C
                    # typed at the prompt arrives as a key and ends the prompt below.
                    handle_sigint=False,
                    # Keep the bot's loop error handling: prompt_toolkit's would pause
                    # for Enter on any background error.
                    set_exception_handler=False,
                )
            except (EOFError, KeyboardInterrupt):  # Ctrl-D, Ctrl-C
                break
            if not await self.handle_line(line):
                break

    async def _plain_lines(self) -> None:
        lines = self._read_lines()
        while not self._closed:
            if self.interactive:
                self._write(f"{self.user.name}> ")
            line = await lines.get()
            if line is None:  # end of input
                break
            if not await self.handle_line(line.rstrip("\r\n")):
                break

    def _read_lines(self) -> asyncio.Queue[str | None]:
        """Lines from stdin, read on a daemon thread, as bytes decoded leniently.

        A blocking readline in the loop's executor would keep the process alive after
        Ctrl-C until the user pressed Enter; a daemon thread never blocks shutdown.
        Bytes are read rather than text so that invalid UTF-8 becomes U+FFFD instead of
        ending the input (a decoding error) or smuggling surrogates into the engine.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        binary = getattr(self.stdin, "buffer", None)

        def reader() -> None:
            while True:
                try:
                    raw = binary.readline() if binary is not None else self.stdin.readline()
                except (OSError, ValueError):
                    raw = ""
                line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, line or None)
                except RuntimeError:  # the loop is gone: we are shutting down
                    return
                if not line:
                    return

        threading.Thread(target=reader, name="terminal-stdin", daemon=True).start()
        return queue

    async def close(self) -> None:
        self._closed = True

    async def handle_line(self, line: str) -> bool:
        """Process one input line; False means the user asked to quit.

        Nothing typed may end the session: a failure is logged and answered in one line.
        """
        try:
            return await self._handle_line(clean_text(line).strip())
        except Exception:
            log.exception("terminal line failed")
            self._answer(f"(notice) {INTERNAL_ERROR}")
            return True

    async def _handle_line(self, text: str) -> bool:
        if not text:
            return True
        if text.startswith("//"):  # an escaped slash: a message, not a command
            await self._message(text[1:])
            return True
        word = text.split(maxsplit=1)[0]
        if not COMMAND_WORD.fullmatch(word):
            await self._message(text)
            return True
        if word in {"/quit", "/exit"}:
            return False
        if word == "/as":
            self._switch_user(text[len(word) :])
        elif word == "/help":
            self._answer(BANNER)
        elif word == "/sonality":
            await self._command(text)
        else:
            self._answer(UNKNOWN_COMMAND.format(word=word))
        return True

    def _switch_user(self, raw: str) -> None:
        name = clean_name(raw)
        if not name:
            self._answer("usage: /as NAME")
            return
        self.user = User(id=_user_id(name), name=name)
        cut = clean_name(raw, limit=None) != name
        note = f"; names are cut to {MAX_NAME_CHARS} characters" if cut else ""
        self._answer(f"(now speaking as {name}{note})")

    async def _message(self, text: str) -> None:
        message = IncomingMessage(
            community=COMMUNITY, channel_id=CHANNEL, user=self.user, text=text, trusted=True
        )
        if not self.interactive:
            # Scripted: exactly one line per answer, so the whole reply is awaited.
            reply = await self.runtime.handle(message)
        else:
            shown: list[str] = []
            screen = WrappedStream(self._write, self._columns())

            async def show(piece: str) -> None:
                screen.feed(("" if shown else "sonality> ") + piece)
                shown.append(piece)

            reply = await self.runtime.handle(message, on_text=show)
            if reply is not None and reply.streamed:
                self._finish_stream("".join(shown), reply, screen)
                if reply.kind is ReplyKind.ANSWER:
                    await self._status()
                return
        if reply is None:
            if not self.interactive:  # keep one answer line per input line
                self._answer("(no reply)")
            return
        prefix = "" if reply.kind is ReplyKind.ANSWER else "(notice) "
        self._answer(prefix + reply.text, speaker="sonality> ")
        if reply.kind is ReplyKind.ANSWER:
            await self._status()

    async def _command(self, text: str) -> None:
        name, args = split_command(text.strip().removeprefix("/sonality"), quotes=True)
        request = CommandRequest(
            community=COMMUNITY,
            caller=self.user,
            is_moderator=True,
            name=name,
            args=args,
            trusted=True,
            channel_id=CHANNEL,
            channel_name=CHANNEL,
        )
        result = await self.runtime.run_command(request)
        found = command(name)
        if found is not None and found.forgets and result.ok and not result.confirm_args:
            result = await self._drop_saved_files(result)
        header = f"[{result.title}]\n" if result.title and self.interactive else ""
        if not result.files:
            self._answer(header + result.text)
            return
        paths = [str(await self._save(f)) for f in result.files]
        # Scripted, the one answer line is the path, so `$(... | run.py)` gets the file.
        self._answer("\n".join([header + result.text, *paths]) if self.interactive else paths[0])

    async def _drop_saved_files(self, result: CommandResult) -> CommandResult:
        """Delete the my-data exports and timeline pictures this terminal saved, and
        empty its input history: they quote or name members, so a forgotten member's
        words or name would stay in the data directory. Which member a forget-user named
        is the runtime's business, and the history does not record who typed a line
        (`/as` switches), so all of it goes; asking again makes a new file."""
        dropped = await asyncio.to_thread(
            _drop_files,
            self.data_dir,
            (f"{MY_DATA_FILE_PREFIX}*.json", f"{TIMELINE_FILE_PREFIX}*.png"),
        )
        cleared = await asyncio.to_thread(_empty_file, self.history_path)
        self._history_cleared = True  # the editor's copy in memory too, before the next line
        notes = [result.text]
        if dropped:
            notes.append(
                f"(Deleted {dropped} saved my-data or timeline file(s) from the data directory.)"
            )
        if cleared:
            notes.append("(Cleared the terminal's input history: Up recalls nothing typed before.)")
        return result.model_copy(update={"text": "\n".join(notes)})

    async def _save(self, attachment: Attachment) -> Path:
        """A command's file in the data directory (e.g. data/timeline-v42.png), replacing
        an older one of the same name; the name is reduced to a bare file name first."""
        name = Path(attachment.name).name
        if name in ("", ".", ".."):
            name = "sonality-output"
        path = (self.data_dir / name).resolve()
        await asyncio.to_thread(_write_private, path, attachment.data)
        return path

    async def _status(self) -> None:
        """ESS, version and staged count once this message's learning has finished."""
        await self.runtime.drain(COMMUNITY.id)
        status = self.runtime.learning_status(COMMUNITY.id)
        if not status:
            return
        if self.interactive:
            width = self._columns()
            self._print("  · " + status if width is None else fit_status(status, width))
        else:
            print("  · " + status, file=self.stderr, flush=True)

    def _finish_stream(self, shown: str, reply: Reply, screen: WrappedStream) -> None:
        """End a streamed answer: what the reply adds after the shown text (a note on a
        long message, or that the reply was cut off), then the line's end."""
        if reply.kind is ReplyKind.ANSWER:
            rest = reply.text[len(shown.strip()) :] if reply.text.startswith(shown.strip()) else ""
            screen.feed(rest)
        else:
            screen.feed("\n(notice) " + reply.text)
        screen.close()
        self._print("")

    def _columns(self) -> int | None:
        """The width to fit text to: the terminal's less one (its last column would
        wrap on its own), or None when stdout is not a terminal."""
        return shutil.get_terminal_size().columns - 1 if self.editing else None

    def _answer(self, text: str, speaker: str = "") -> None:
        """One answer: as it is at a terminal, as exactly one line when scripted."""
        if self.interactive:
            shown = speaker + text
            width = self._columns()
            if width is not None:  # a terminal on stdout: fit its width
                shown = fit_to_width(shown, width)
            self._print(shown)
        else:  # newlines become a literal backslash-n (and backslashes are doubled)
            self._print(text.replace("\\", "\\\\").replace("\r", "").replace("\n", "\\n"))

    def _print(self, text: str) -> None:
        print(text, file=self.stdout, flush=True)

    def _write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()


def clean_text(text: str) -> str:
    """Text as valid Unicode: undecodable bytes (surrogates) become U+FFFD and control
    characters other than tab are dropped."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that are not escaped bytes
        raw = text.encode("utf-8", "surrogatepass")
    decoded = raw.decode("utf-8", "replace")
    return "".join(c for c in decoded if c == "\t" or unicodedata.category(c) != "Cc")


def clean_name(raw: str, limit: int | None = MAX_NAME_CHARS) -> str:
    """A display name: printable, single-spaced, at most `limit` characters."""
    printable = "".join(c for c in clean_text(raw) if not unicodedata.category(c).startswith("C"))
    return " ".join(printable.split())[:limit].strip()


def _write_private(path: Path, data: bytes) -> None:
    """A command's file (a my-data export, a picture) for its owner's eyes only, also
    when it replaces an older file of the same name that others could read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(data)


def _private_file(path: Path) -> Path:
    """The history holds what was typed: readable by its owner only."""
    path.touch(mode=0o600, exist_ok=True)
    return path


def _user_id(name: str) -> str:
    return "terminal-" + "-".join(name.lower().split())


class WrappedStream:
    """Streamed text written as it comes, broken between words at `width` columns: a
    terminal would cut a word in two at its edge. A word is held back until the space
    after it arrives (a chunk may end inside it), so the text on screen is the text
    streamed, with a line break in place of the space before each word that would not
    fit. `width=None` writes it unchanged."""

    def __init__(self, write: Callable[[str], None], width: int | None) -> None:
        self._write = write
        self._width = width if width is not None and width >= 20 else None
        self._column = 0
        self._space = ""
        self._word = ""

    def feed(self, text: str) -> None:
        if self._width is None:
            self._write(text)
            return
        for char in text:
            if char == "\n":
                self._emit()
                self._write("\n")
                self._column, self._space = 0, ""
            elif char.isspace():
                self._emit()
                self._space += char
            else:
                self._word += char

    def close(self) -> None:
        """Write the last word (trailing spaces are dropped)."""
        if self._width is not None:
            self._emit()
            self._space = ""

    def _emit(self) -> None:
        if not self._word:
            return
        assert self._width is not None
        wide = cell_len(self._space + self._word)
        if self._column and self._column + wide > self._width:
            self._write("\n")
            self._column, self._space = 0, ""
            wide = cell_len(self._word)
        self._write(self._space + self._word)
        self._column += wide
        self._space = self._word = ""


def fit_to_width(text: str, width: int) -> str:
    """Lines wider than `width` columns broken between words, each continuation
    indented two spaces past its line's own indent: a terminal would cut them mid-word
    (a history line's topic, a status line's date). Columns, not characters: a CJK
    character or an emoji takes two; a run wider than a line (CJK has no spaces) is
    broken between characters."""
    if width < 20:
        return text  # too narrow to wrap usefully
    lines: list[str] = []
    for line in text.split("\n"):
        if cell_len(line) <= width:
            lines.append(line)
            continue
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        lines.extend(_wrapped(body, width, indent, indent + "  "))
    return "\n".join(lines)


def fit_status(status: str, width: int) -> str:
    """The status line (fields joined by " · ") at `width` columns, broken only between
    fields: broken between words, "beliefs" ended one line and its count began the
    next. A field wider than a line is then broken between words after all."""
    if width < 20:
        return "  · " + status  # too narrow to wrap usefully, as in `fit_to_width`
    fields = status.split(" · ")
    lines, line = [], "  · " + fields[0]
    for field in fields[1:]:
        if cell_len(line) + cell_len(" · " + field) <= width:
            line += " · " + field
        else:
            lines.append(line)
            line = "    · " + field
    return fit_to_width("\n".join([*lines, line]), width)


def _wrapped(text: str, width: int, first: str, rest: str) -> list[str]:
    """`text` in lines of at most `width` columns, the first after `first` and the
    others after `rest`; the spaces between words kept as typed, none at a break."""
    out: list[str] = []
    prefix, line, gap = first, "", ""
    for token in re.split(r"(\s+)", text):
        if not token:
            continue
        if token.isspace():
            gap = token
            continue
        for piece in _pieces(token, width - cell_len(rest)):
            if line and cell_len(prefix + line + gap + piece) > width:
                out.append(prefix + line)
                prefix, line, gap = rest, "", ""
            line += gap + piece
            gap = ""
    return [*out, prefix + line] if line else out


def _pieces(word: str, room: int) -> list[str]:
    """`word` cut between characters into pieces of at most `room` columns."""
    if cell_len(word) <= room:
        return [word]
    pieces, piece = [], ""
    for char in word:
        if piece and cell_len(piece + char) > room:
            pieces.append(piece)
            piece = ""
        piece += char
    return [*pieces, piece]


def _empty_file(path: Path) -> bool:
    """Truncate `path` in place (its owner-only mode stays); whether it held anything."""
    try:
        with path.open("r+b") as fh:
            held = fh.read(1) != b""
            fh.truncate(0)
    except FileNotFoundError:
        return False
    return held


def _drop_files(directory: Path, patterns: Sequence[str]) -> int:
    """Delete the files of `directory` matching any of `patterns`; how many there were."""
    found = sorted({path for pattern in patterns for path in directory.glob(pattern)})
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)
