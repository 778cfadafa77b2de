"""Forget-me leaves nothing behind, at every stack (issue 22, "What it must show").

Mallory argues until her word is a topic (it reaches other members' prompts as "Top
topics: ..."), then runs forget-me while a reply to her is still being written. After
that her word and her id are in no file of the data directory (the SQLite file after
the forget-me's VACUUM and WAL checkpoint, the Chroma directory), no row of any table
(each version's state JSON included), no record of the Chroma server, and no LLM
request sent after her slow reply's; and a backup taken before the forget-me, restored,
does not bring her back.

Embedded stack (SQLite + Chroma directory): the backup and restore are the real
`python -m app backup` / `restore`. Scale-out stack (PostgreSQL + Chroma server): the
state is the server's to back up (pg_dump, or here a copy of the database made while
the bot was stopped); the bot started on the copy finds the forget-me it lacks in the
data directory's forget journal and applies it again before learning anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chromadb
import psycopg

from app.wiring import open_runtime
from bot.forget_journal import FILE_NAME
from bot.messages import ReplyKind, User
from bot.settings import Settings
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import (
    BOB,
    A,
    chat_requests,
    command,
    make_settings,
    prompt_of,
    say,
)
from tests.integration.forget_scenario import files_holding, reply_in_flight, requests_holding
from tests.integration.test_backup import bot_command
from tests.stack import Stack, on_every_stack

pytestmark = on_every_stack

WORD = "mallorysecretword"
MALLORY = User(id="u-mallory-7731", name="Mallory")
CAROL = User(id="u-carol", name="Carol")
NEEDLES = [WORD, MALLORY.id]


def teach(server: AnthropicFake) -> None:
    server.brain.ess_rule(
        contains="(mallarg)",
        score=0.8,
        direction="supports",
        topics=[WORD],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary=f"The sender insists {WORD} should decide the matter.",
    )
    server.brain.ess_rule(
        contains="(bobarg)",
        score=0.7,
        direction="opposes",
        topics=["remote_work"],
        novelty=0.7,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="The sender cites a panel study against remote work.",
    )


# ------------------------------------------------------------------------------ scans


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[Any]:
    url = settings.postgres_url
    if url is not None:
        with psycopg.connect(url) as conn:
            yield conn
    else:
        file = sqlite3.connect(settings.resolved_database_path)
        try:
            yield file
        finally:
            file.close()


def rows_holding(settings: Settings, needles: list[str]) -> list[str]:
    """`table: needle` for every row of every table holding a needle."""
    postgres = settings.postgres_url is not None
    tables = (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        if postgres
        else "SELECT name FROM sqlite_master WHERE type = 'table'"
    )
    found = []
    with database(settings) as conn:
        for (table,) in conn.execute(tables).fetchall():
            for row in conn.execute(f'SELECT * FROM "{table}"').fetchall():
                text = " ".join(str(value) for value in row)
                found += [f"{table}: {n}" for n in needles if n in text]
    return found


def chroma_server_holding(settings: Settings, needles: list[str]) -> list[str]:
    """`collection: needle` for every record of the Chroma server's database (documents
    and metadata) holding a needle; nothing without a Chroma server."""
    if settings.chroma_url is None:
        return []
    host, port = settings.chroma_url.removeprefix("http://").rsplit(":", 1)
    client = chromadb.HttpClient(host=host, port=int(port), database=settings.chroma_database)
    found = []
    for collection in client.list_collections():
        got = collection.get(include=["documents", "metadatas"])
        text = f"{got['documents']} {got['metadatas']}"
        found += [f"{collection.name}: {n}" for n in needles if n in text]
    return found


def left_behind(settings: Settings) -> list[str]:
    return [
        *files_holding([settings.data_dir], NEEDLES),
        *rows_holding(settings, NEEDLES),
        *chroma_server_holding(settings, NEEDLES),
    ]


# ------------------------------------------------------------------------------ backups


async def back_up(stack: Stack, settings: Settings, tmp_path: Path) -> Any:
    """A copy of the stopped bot's state: the backup command's directory, or (with
    PostgreSQL) a copy of its database; returns what `restore` takes."""
    if stack.postgres is None:
        made = await asyncio.to_thread(
            bot_command, tmp_path, settings.data_dir, "backup", str(tmp_path / "backup")
        )
        assert made.returncode == 0, made.stderr
        return tmp_path / "backup"
    url = settings.postgres_url
    assert url is not None
    name = url.rsplit("/", 1)[1]
    copy = stack.postgres.new_database(template=name)
    return copy


async def restore(stack: Stack, settings: Settings, backup: Any, tmp_path: Path) -> Settings:
    """The pre-forget copy put back: the settings of a bot that runs on it."""
    if stack.postgres is None:
        target = tmp_path / "restored"
        put_back = await asyncio.to_thread(
            bot_command,
            tmp_path,
            target,
            "restore",
            str(backup),
            "--forget-journal",
            str(settings.data_dir / FILE_NAME),
        )
        assert put_back.returncode == 0, put_back.stderr
        return make_settings(target)
    return make_settings(settings.data_dir, DATABASE_URL=backup)


# ------------------------------------------------------------------------------ the test


async def test_forget_me_with_a_reply_in_flight_leaves_nothing_anywhere(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake, stack: Stack
) -> None:
    teach(anthropic_server)
    settings = make_settings(tmp_path / "data")
    async with open_runtime(settings, llm=llm) as runtime:
        for n in range(3):
            await say(runtime, f"Point {n}: {WORD} is what matters here (mallarg).", user=MALLORY)
            await say(runtime, f"Point {n}: a panel study says no (bobarg).", user=BOB)
            await say(runtime, f"Nice weather, chat {n}.", user=CAROL)
        agent = runtime.registry.get(A.id)
        assert agent is not None
        assert WORD in agent.sponge.behavioral_signature.topic_engagement
        assert WORD in prompt_of(chat_requests(anthropic_server)[-1])  # in others' prompts
    assert rows_holding(settings, NEEDLES)  # the scans can fail
    backup = await back_up(stack, settings, tmp_path)

    async with open_runtime(settings, llm=llm) as runtime:
        slow = await reply_in_flight(
            runtime, anthropic_server, A, MALLORY, f"One last time: {WORD} (mallarg)."
        )
        since = len(anthropic_server.requests)  # her slow reply's request is the last before
        done = await command(runtime, "forget-me", "confirm", user=MALLORY, moderator=False)
        assert done.ok and "Forgotten" in done.text
        reply = await slow
        assert reply is not None and reply.kind is ReplyKind.ANSWER
        await say(runtime, "What do you make of remote work now? (bobarg)", user=BOB)
        await say(runtime, "Any plans for the weekend?", user=CAROL)
        reflected = await command(runtime, "reflect")
        assert reflected.ok, reflected.text
        agent = runtime.registry.get(A.id)
        assert agent is not None
        await agent.flush_episodes()
        assert len(anthropic_server.requests) > since + 3
        assert requests_holding(anthropic_server.requests[since:], NEEDLES) == []
    assert left_behind(settings) == []

    restored = await restore(stack, settings, backup, tmp_path)
    since = len(anthropic_server.requests)
    async with open_runtime(restored, llm=llm) as runtime:
        await runtime.drain()
        [latest] = await runtime.db.community(A.id).versions(limit=1)
        assert latest.cause == "forget-me"
        await say(runtime, "And now? (bobarg)", user=BOB)
    assert requests_holding(anthropic_server.requests[since:], NEEDLES) == []
    assert left_behind(restored) == []
