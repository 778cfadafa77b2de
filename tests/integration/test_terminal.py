"""The terminal community as a newcomer meets it: the real `python -m app` process,
at a pseudo-terminal (line editing, history) and scripted over pipes (one answer line
per input line, no flood limit for the operator, bad bytes and typos answered)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import signal
import struct
import sys
import termios
from asyncio.subprocess import Process
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bot.messages import SLOW_DOWN, Community, IncomingMessage, User
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.integration.conftest import chat_requests, make_settings
from tests.integration.test_process import _start_bot, bot_env

LEFT, UP, ENTER, CTRL_C, CTRL_D = b"\x1b[D", b"\x1b[A", b"\r", b"\x03", b"\x04"
# The prompt as drawn (the editor moves the cursor rather than printing the space) and
# the status line that follows every answer at a terminal.
PROMPT, STATUS = b"you>", "· ESS".encode()


def model_calls(server: Any) -> list[Any]:
    """Messages API calls (the start-up check only reads the Models API)."""
    return [r for r in server.requests if r.path == "/v1/messages"]


async def run_script(tmp_path: Path, server: Any, script: bytes) -> tuple[list[str], str]:
    proc = await _start_bot(tmp_path / "data", server.base_url, tmp_path)
    out, err = await asyncio.wait_for(proc.communicate(script), 180)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    return out.decode().splitlines(), err.decode()


class Screen:
    """Everything the bot writes to its terminal, read as it arrives so it never blocks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""
        self._changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # the bot closed the terminal
            chunk = b""
        if not chunk:
            asyncio.get_running_loop().remove_reader(self.fd)
        self.data += chunk
        self._changed.set()

    async def wait_for(self, text: bytes, after: int = 0, seconds: float = 120) -> int:
        """Wait until `text` appears past offset `after`; the offset just past it."""

        async def seen() -> int:
            while (at := self.data.find(text, after)) < 0:
                self._changed.clear()
                await self._changed.wait()
            return at + len(text)

        try:
            return await asyncio.wait_for(seen(), seconds)
        except TimeoutError:
            raise AssertionError(f"never saw {text!r} in {self.data[after:][-2000:]!r}") from None

    async def answered(self, after: int) -> int:
        """Past the status line of the answer to a line sent at `after`, and the next
        prompt (only then is the terminal back in the editor's raw mode)."""
        return await self.wait_for(PROMPT, await self.wait_for(STATUS, after))

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.fd)


async def start_at_terminal(tmp_path: Path, server: Any) -> tuple[Process, Screen, int]:
    """The bot with a pseudo-terminal as stdin, stdout and stderr (80x24, xterm)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        cwd=tmp_path,
        env=bot_env(
            tmp_path / "data",
            ANTHROPIC_API_KEY=FAKE_API_KEY,
            ANTHROPIC_BASE_URL=server.base_url,
            TERM="xterm",
            # Nobody answers cursor-position requests on this terminal.
            PROMPT_TOOLKIT_NO_CPR="1",
        ),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    return proc, Screen(controller), controller


async def stop(proc: Process, screen: Screen, controller: int) -> None:
    screen.close()
    os.close(controller)
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_arrow_keys_edit_the_line_and_up_recalls_the_previous_one(
    tmp_path: Path, anthropic_server
) -> None:
    proc, screen, controller = await start_at_terminal(tmp_path, anthropic_server)
    try:
        at = await screen.wait_for(PROMPT)
        # "helo world", seven steps left (after "hel"), insert the missing "l".
        os.write(controller, b"helo world" + LEFT * 7 + b"l" + ENTER)
        at = await screen.answered(at)
        sent = [r.last_user_text for r in chat_requests(anthropic_server)]
        assert len(sent) == 1
        assert "hello world" in sent[0]
        assert "helo world" not in sent[0]

        os.write(controller, UP + ENTER)  # the previous line, sent again as it was
        await screen.answered(at)
        sent = [r.last_user_text for r in chat_requests(anthropic_server)]
        assert len(sent) == 2
        assert "hello world" in sent[1]

        os.write(controller, CTRL_D)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await stop(proc, screen, controller)
    assert "hello world" in (tmp_path / "data" / "terminal_history").read_text()


async def test_a_forget_empties_the_input_history_on_disk_and_in_the_editor(
    tmp_path: Path, anthropic_server
) -> None:
    """The history holds what members said (whoever `/as` made the operator): after a
    forget, neither the file nor Up may bring a line typed before it back."""
    history = tmp_path / "data" / "terminal_history"
    proc, screen, controller = await start_at_terminal(tmp_path, anthropic_server)
    try:
        at = await screen.wait_for(PROMPT)
        os.write(controller, b"zebras are my secret" + ENTER)
        at = await screen.answered(at)
        os.write(controller, b"/sonality forget-me" + ENTER)
        at = await screen.wait_for(PROMPT, await screen.wait_for(b"forget-me confirm", at))
        assert "zebras" in history.read_text()
        os.write(controller, b"/sonality forget-me confirm" + ENTER)
        at = await screen.wait_for(PROMPT, await screen.wait_for(b"input history", at))
        assert "zebras" not in history.read_text()
        since = len(chat_requests(anthropic_server))
        # Before the fix, three steps up were the secret line, sent again by Enter.
        os.write(controller, UP * 3 + ENTER)
        at = await screen.wait_for(PROMPT, at)
        os.write(controller, b"after the forget" + ENTER)
        await screen.answered(at)
        sent = [r.last_user_text for r in chat_requests(anthropic_server)[since:]]
        assert len(sent) == 1
        assert "after the forget" in sent[0]
        assert "zebras" not in sent[0]
        os.write(controller, CTRL_D)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await stop(proc, screen, controller)
    assert "zebras" not in history.read_text()
    assert history.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("how", ["Ctrl-C typed", "SIGINT"])
async def test_the_editor_ends_on_ctrl_c(tmp_path: Path, anthropic_server, how: str) -> None:
    """Typed, Ctrl-C is a key the editor reads; sent as a signal (kill -INT) it goes to
    the bot's own handler. Either way the bot stops cleanly while waiting at the prompt."""
    proc, screen, controller = await start_at_terminal(tmp_path, anthropic_server)
    try:
        await screen.wait_for(PROMPT)
        if how == "SIGINT":
            proc.send_signal(signal.SIGINT)
        else:
            os.write(controller, b"half a line" + CTRL_C)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await stop(proc, screen, controller)
    assert chat_requests(anthropic_server) == []


async def test_scripted_every_input_line_gets_one_answer_line_and_no_flood_limit(
    tmp_path: Path, anthropic_server
) -> None:
    """30 lines in (20 messages, 10 status commands) -> 30 lines out, all answered,
    although 20 messages are far more than the members' limit of 6 a minute."""
    lines_in = ["/sonality status" if i % 3 == 2 else f"message number {i}" for i in range(30)]
    out, _ = await run_script(tmp_path, anthropic_server, "\n".join(lines_in).encode() + b"\n")
    assert len(out) == 30, out
    assert not any(SLOW_DOWN in line for line in out)
    assert sum(line.startswith("Version: v") for line in out) == 10
    assert len(chat_requests(anthropic_server)) == 20


async def test_typos_are_answered_without_asking_the_model(
    tmp_path: Path, anthropic_server
) -> None:
    out, _ = await run_script(
        tmp_path, anthropic_server, b"/sonalty beliefs\n/foo\n/sonality frobnicate\n"
    )
    assert out[0] == "unknown command /sonalty, try /sonality help"
    assert out[1] == "unknown command /foo, try /sonality help"
    assert out[2].startswith("Unknown command `frobnicate`.")
    assert len(out) == 3
    assert model_calls(anthropic_server) == []


async def test_a_line_starting_with_two_slashes_is_a_message(
    tmp_path: Path, anthropic_server
) -> None:
    out, _ = await run_script(tmp_path, anthropic_server, b"//sonality is a made-up word\n")
    assert len(out) == 1
    sent = [r.last_user_text for r in chat_requests(anthropic_server)]
    assert len(sent) == 1
    assert "/sonality is a made-up word" in sent[0]


async def test_bad_names_and_bytes_get_short_answers_and_the_bot_keeps_running(
    tmp_path: Path, anthropic_server
) -> None:
    script = b"/as " + b"0" * 250 + b"\nhi\n/as B\xffob\nhello \xff\xfe world\n/sonality status\n"
    out, _ = await run_script(tmp_path, anthropic_server, script)
    assert len(out) == 5, out
    assert out[0] == f"(now speaking as {'0' * 64}; names are cut to 64 characters)"
    assert out[2] == "(now speaking as B\ufffdob)"
    assert "Interactions: 2" in out[4]
    sent = chat_requests(anthropic_server)
    assert len(sent) == 2
    assert "hello \ufffd\ufffd world" in sent[1].last_user_text


async def test_only_the_terminal_operator_skips_the_flood_limit(tmp_path: Path, llm) -> None:
    settings = make_settings(tmp_path / "data", llm=llm, SONALITY_RATE_LIMIT_MESSAGES=2)
    community = Community(id="terminal:local")
    async with open_runtime(settings, llm=llm) as runtime:

        async def send(user: User, trusted: bool) -> str | None:
            message = IncomingMessage(
                community=community, channel_id="c", user=user, text="hi", trusted=trusted
            )
            reply = await runtime.handle(message)
            return None if reply is None else reply.text

        operator, member = User(id="op", name="Op"), User(id="m", name="Member")
        operator_replies = [await send(operator, True) for _ in range(4)]
        member_replies = [await send(member, False) for _ in range(3)]
        await runtime.drain()
    assert all(r is not None and r != SLOW_DOWN for r in operator_replies)
    assert member_replies[2] == SLOW_DOWN
    assert SLOW_DOWN not in member_replies[:2]
