"""`python -m app` on Discord when Discord will not have it: one line, exit code 2.

A rejected token, an address where nothing answers and a token that cannot even be
sent each end in ONE line on stderr naming what to fix, with no traceback, and the
log carries no warnings about voice libraries the bot never uses. Real discord.py in
the bot's own process, against the loopback fake (which rejects a wrong token the way
Discord does: 401 on REST, close code 4004 on the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from adapters.discord import TOKEN_HELP
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_server import FakeDiscord
from tests.integration.test_process import _start_bot


@contextlib.asynccontextmanager
async def _fake_discord() -> AsyncIterator[FakeDiscord]:
    fake = FakeDiscord()
    fake.add_guild("Guild A")
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


async def _refused(
    tmp_path: Path, anthropic: AnthropicFake, api_suffix: str = "", **env: str
) -> tuple[list[str], FakeDiscord]:
    """Start the bot on the fake Discord (its API base + `api_suffix`): it must exit 2
    with no traceback and no voice warning; its stderr lines, and the fake."""
    async with _fake_discord() as fake:
        proc = await _start_bot(
            tmp_path / "data",
            anthropic.base_url,
            tmp_path,
            asyncio.subprocess.DEVNULL,
            None,
            **{
                "DISCORD_TOKEN": fake.token,
                "DISCORD_API_BASE_URL": fake.api_base + api_suffix,
                "DISCORD_GATEWAY_URL": fake.gateway_url,
                **env,
            },
        )
        out, err = (s.decode() for s in await asyncio.wait_for(proc.communicate(), 120))
    assert proc.returncode == 2, out[-3000:] + err
    assert "Traceback" not in out + err, out[-3000:]
    assert "voice will NOT be supported" not in out, out  # the bot never joins voice
    return [line for line in err.splitlines() if line.strip()], fake


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_rejected_token_is_one_line_and_no_voice_warnings(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    err, fake = await _refused(tmp_path, anthropic_server, DISCORD_TOKEN="an-old-token")
    assert err == [f"error: {TOKEN_HELP}"]
    assert fake.find("GET", "/users/@me") and not fake.identifies


async def test_discord_unreachable_is_one_line_naming_the_address(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    api = f"http://127.0.0.1:{_closed_port()}/api/v10"
    err, _ = await _refused(tmp_path, anthropic_server, DISCORD_API_BASE_URL=api)
    assert err == [
        f"error: could not reach Discord at DISCORD_API_BASE_URL={api} (connection refused); "
        "check the network and the address"
    ]


async def test_an_answer_that_is_not_discords_is_one_line(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    """A wrong path on a server that answers (a proxy, a typo in the URL): 404 at login."""
    err, fake = await _refused(tmp_path, anthropic_server, api_suffix="/nothing-here")
    [line] = err
    wrong = fake.api_base + "/nothing-here"
    assert line.startswith(f"error: Discord's API at DISCORD_API_BASE_URL={wrong} answered 404 ")


async def test_a_token_with_a_line_break_is_refused_before_anything_starts(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    """A token pasted over two lines used to end in aiohttp's header-injection error."""
    err, fake = await _refused(tmp_path, anthropic_server, DISCORD_TOKEN="first-half\nsecond-half")
    assert err == [
        "error: DISCORD_TOKEN=(hidden) is not allowed: must be the bot token alone, without "
        "spaces or line breaks (copy it from Bot → Reset Token in the Discord Developer Portal)"
    ]
    assert not fake.requests and not anthropic_server.requests
    assert not (tmp_path / "data").exists()


async def test_the_fake_gateway_closes_an_unknown_token_with_4004() -> None:
    """Discord checks the token again at IDENTIFY; so must the fake."""
    async with _fake_discord() as fake, aiohttp.ClientSession() as session:
        for token, expected in (("not-the-token", 4004), (fake.token, None)):
            async with session.ws_connect(fake.gateway_url) as ws:
                hello = await ws.receive_json(timeout=10)
                assert hello["op"] == 10
                await ws.send_str(
                    json.dumps({"op": 2, "d": {"token": token, "intents": 1, "properties": {}}})
                )
                reply = await ws.receive(timeout=10)
                if expected is None:
                    assert json.loads(reply.data)["t"] == "READY"
                else:
                    assert reply.type == aiohttp.WSMsgType.CLOSE
                    assert ws.close_code == expected
