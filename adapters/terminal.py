"""A local community in the terminal: the embedded default platform.

It exists so anyone with an API key can watch the personality work without a Discord
or Slack app: chat as several people (`/as NAME`), then inspect or roll back with the
same `/sonality` commands moderators use (the terminal user is a moderator). With stdin
not a terminal it reads one message per line and prints one reply per line, so it can
be scripted; the status line then goes to stderr.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import threading
from typing import TextIO

from bot.interface import ChatRuntime
from bot.messages import CommandRequest, Community, IncomingMessage, ReplyKind, User
from bot.settings import Settings

COMMUNITY = Community(id="terminal:local", name="terminal")
BANNER = (
    "Sonality terminal community. Type a message and press Enter.\n"
    "  /as NAME              speak as someone else\n"
    "  /sonality help        moderator commands (you are a moderator here)\n"
    "  /quit                 leave (Ctrl-D works too)"
)


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
        self.user = User(id=_user_id(settings.terminal_user), name=settings.terminal_user)
        self.interactive = self.stdin.isatty()
        self._closed = False

    async def start(self) -> None:
        if self.interactive:
            self._print(BANNER)
        lines = self._read_lines()
        while not self._closed:
            if self.interactive:
                self._write(f"{self.user.name}> ")
            line = await lines.get()
            if line is None:  # end of input
                break
            if not await self.handle_line(line.rstrip("\n")):
                break

    def _read_lines(self) -> asyncio.Queue[str | None]:
        """Lines from stdin, read on a daemon thread.

        A blocking readline in the loop's executor would keep the process alive after
        Ctrl-C until the user pressed Enter; a daemon thread never blocks shutdown.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        def reader() -> None:
            while True:
                try:
                    line = self.stdin.readline()
                except (OSError, ValueError):
                    line = ""
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
        """Process one input line; False means the user asked to quit."""
        text = line.strip()
        if not text:
            return True
        if text in {"/quit", "/exit"}:
            return False
        if text == "/as" or text.startswith("/as "):
            name = text[3:].strip()
            if not name:
                self._print("usage: /as NAME")
            else:
                self.user = User(id=_user_id(name), name=name)
                self._print(f"(now speaking as {name})")
            return True
        if text.startswith("/sonality"):
            await self._command(text)
            return True
        message = IncomingMessage(
            community=COMMUNITY, channel_id="terminal", user=self.user, text=text
        )
        reply = await self.runtime.handle(message)
        if reply is None:
            return True
        prefix = "" if reply.kind is ReplyKind.ANSWER else "(notice) "
        if self.interactive:
            self._print(f"sonality> {prefix}{reply.text}")
        else:  # one line per reply: newlines become a literal backslash-n
            self._print(prefix + reply.text.replace("\\", "\\\\").replace("\n", "\\n"))
        if reply.kind is ReplyKind.ANSWER:
            await self._status()
        return True

    async def _command(self, text: str) -> None:
        try:
            parts = shlex.split(text)
        except ValueError:
            parts = text.split()
        if len(parts) < 2:
            parts.append("help")
        request = CommandRequest(
            community=COMMUNITY,
            caller=self.user,
            is_moderator=True,
            name=parts[1],
            args=tuple(parts[2:]),
        )
        result = await self.runtime.run_command(request)
        header = f"[{result.title}]\n" if result.title and self.interactive else ""
        self._print(header + result.text)

    async def _status(self) -> None:
        """ESS, version and staged count once this message's learning has finished."""
        await self.runtime.drain(COMMUNITY.id)
        status = self.runtime.learning_status(COMMUNITY.id)
        if not status:
            return
        line = "  · " + status
        if self.interactive:
            self._print(line)
        else:
            print(line, file=self.stderr, flush=True)

    def _print(self, text: str) -> None:
        print(text, file=self.stdout, flush=True)

    def _write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()


def _user_id(name: str) -> str:
    return "terminal-" + "-".join(name.lower().split())
