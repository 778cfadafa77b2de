"""`python -m app` as a real process: start-up errors, scripted terminal, crash and replay."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from app.wiring import open_runtime
from bot.messages import Community
from sonality.state import SpongeState
from sonality.store import Episode, StateCommit
from storage.db import open_database
from tests.checkout import importing_this_checkout
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.anthropic_server import Delay, Text
from tests.forked_bot import ChildProcess, start_module
from tests.integration.conftest import MODEL_CACHE, ess_requests, eventually, make_settings
from tests.stack import Stack, on_every_stack

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = "terminal:local"


def bot_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "DISCORD_", "SLACK_", "SONALITY_", "DATABASE_URL"))
    }
    env.update(
        SONALITY_DATA_DIR=str(data_dir),
        SONALITY_MODEL_CACHE_DIR=str(MODEL_CACHE),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return importing_this_checkout(env)


def test_without_a_key_it_exits_at_once_naming_the_variable(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app"],
        cwd=tmp_path,
        env=bot_env(tmp_path / "data"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "ANTHROPIC_API_KEY" in lines[0]
    assert not (tmp_path / "data" / "sonality.sqlite3").exists()


async def _start_bot(
    data_dir: Path,
    base_url: str,
    cwd: Path,
    stdin: int | IO[str] = asyncio.subprocess.PIPE,
    on: Stack | None = None,
    /,
    **extra_env: str,
) -> ChildProcess:
    """`python -m app` on the loopback Anthropic fake; `on` puts it on a test stack.

    Forked from the preloaded Python (tests/forked_bot.py): the program as it runs,
    without paying the libraries' import again; tests of the start itself spawn."""
    stack_env = {} if on is None else on.settings(data_dir)
    return await start_module(
        "app",
        cwd=cwd,
        env=bot_env(
            data_dir,
            ANTHROPIC_API_KEY=FAKE_API_KEY,
            ANTHROPIC_BASE_URL=base_url,
            **{**stack_env, **extra_env},
        ),
        stdin=stdin,
    )


async def test_scripted_terminal_session(tmp_path: Path, anthropic_server) -> None:
    """Stdin not a terminal: one reply line per message line; commands work; EOF exits."""
    anthropic_server.brain.reply_rule(contains="two lines", text="first line\nsecond line")
    proc = await _start_bot(tmp_path / "data", anthropic_server.base_url, tmp_path)
    script = "hello bot\n/as Bob\nplease answer in two lines\n/sonality status\n"
    out, err = await asyncio.wait_for(proc.communicate(script.encode()), 120)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0] == "[reply] hello bot"
    assert lines[1] == "(now speaking as Bob)"
    assert lines[2] == "first line\\nsecond line"
    assert "Interactions: 2" in out.decode()
    assert "ESS 0.02" in err.decode()  # the status line goes to stderr when scripted


@on_every_stack
async def test_crash_between_reply_and_learning_replays_exactly_once(
    tmp_path: Path, anthropic_server, llm, stack: Stack
) -> None:
    """The bot process is killed (SIGKILL) after replying, while learning waits on the
    ESS call; the next start replays that learning once: one new version, no gap, no
    double, and its episode stored once (in the Chroma server on the scale-out stack)."""
    data_dir = tmp_path / "data"
    anthropic_server.brain.ess_rule(
        contains="reactor fleet",
        score=0.8,
        direction="supports",
        topics=["nuclear_energy"],
        novelty=0.9,
    )
    # The reply is answered; the ESS call then hangs, and the process is killed meanwhile.
    anthropic_server.enqueue(Text("Interesting point."), Delay(60))
    proc = await _start_bot(
        data_dir, anthropic_server.base_url, tmp_path, asyncio.subprocess.PIPE, stack
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"The reactor fleet data says nuclear is safe.\n")
    await proc.stdin.drain()
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    assert line.decode().strip() == "Interesting point."
    assert await eventually(lambda: bool(ess_requests(anthropic_server)), seconds=10)
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    # On PostgreSQL the killed process left its unfinished learning in the server only.
    assert (data_dir / "sonality.sqlite3").exists() == (stack.postgres is None)

    settings = make_settings(data_dir)
    async with open_runtime(settings, llm=llm) as runtime:
        assert runtime.db.engine_name == ("sqlite" if stack.postgres is None else "postgresql")
        assert (settings.chroma_url is not None) == stack.on_chroma_server
        agent = runtime.registry.get(TERMINAL)
        assert agent is not None, "the unfinished community is loaded at start"
        await runtime.drain()
        store = runtime.db.community(TERMINAL)
        assert agent.sponge.interaction_count == 1
        assert len(agent.sponge.staged_opinion_updates) == 1
        assert [v.version for v in await store.versions()] == [1, 0]
        assert await store.pending_count() == 0
        assert len(await store.audit_events(kind="ess")) == 1
        assert agent.episodes.count() == 1
    assert len(ess_requests(anthropic_server)) == 2  # the killed attempt and the replay

    async with open_runtime(settings, llm=llm) as runtime:
        assert runtime.registry.get(TERMINAL) is None  # nothing left to replay
        store = runtime.db.community(TERMINAL)
        assert [v.version for v in await store.versions()] == [1, 0]
    assert len(ess_requests(anthropic_server)) == 2


@on_every_stack
async def test_sigterm_finishes_pending_learning(
    tmp_path: Path, anthropic_server, llm, stack: Stack
) -> None:
    anthropic_server.enqueue(Text("Noted."), Delay(1.0))  # ESS slow but within the timeout
    data_dir = tmp_path / "data"
    proc = await _start_bot(
        data_dir, anthropic_server.base_url, tmp_path, asyncio.subprocess.PIPE, stack
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"remember this\n")
    await proc.stdin.drain()
    assert (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip() == "Noted."
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 60)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        store = runtime.db.community(TERMINAL)
        assert await store.pending_count() == 0
        assert [v.version for v in await store.versions()] == [1, 0]


@on_every_stack
async def test_committed_but_unwritten_memories_are_written_on_next_start(
    tmp_path: Path, llm, stack: Stack
) -> None:
    """A crash after the commit but before the Chroma write loses no memory."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db = await open_database(url=stack.database_url(data_dir), path=data_dir / "sonality.sqlite3")
    lost = Episode(
        id="interaction-1",
        user_message="Raised zebra crossings cut injuries by 40% in the audit.",
        summary="User cites a road-safety audit on raised zebra crossings.",
        ess_score=0.8,
        interaction=1,
    )
    await db.community(TERMINAL).commit(
        StateCommit(state=SpongeState(), cause="seed", change="seed", episodes=[lost])
    )
    await db.close()

    async with open_runtime(make_settings(data_dir), llm=llm) as runtime:
        agent = await runtime.registry.agent_for(Community(id=TERMINAL))
        await runtime.drain()
        assert agent.episodes.count() == 1
        assert await runtime.db.community(TERMINAL).pending_episodes() == []
        found = agent.episodes.retrieve("zebra crossing safety audit")
        assert found == [lost.summary]


async def test_ctrl_c_at_the_interactive_prompt_exits(tmp_path: Path, anthropic_server) -> None:
    """With a real terminal on stdin, SIGINT while waiting for input ends the bot."""
    controller, terminal = pty.openpty()
    try:
        proc = await _start_bot(tmp_path / "data", anthropic_server.base_url, tmp_path, terminal)
        assert proc.stdout is not None
        banner = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert b"Sonality terminal community" in banner
        await asyncio.sleep(0.5)  # now blocked reading the terminal
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 20)
        assert code == 0
    finally:
        os.close(controller)
        os.close(terminal)
