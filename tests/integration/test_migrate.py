"""`python -m app migrate`: a SQLite + local Chroma community moved onto PostgreSQL and a
Chroma server answers and recalls the same.

Nothing is mocked: the community is built by the real runtime (real Anthropic SDK
against its loopback fake, real MiniLM model, embedded Chroma, the SQLite file), the
command runs as a child process, and the moved bot runs on the session's real
PostgreSQL (pgserver) and a real `chroma run` server.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from app.lock import DataDirLock
from app.wiring import open_runtime
from bot.messages import IncomingMessage, ReplyKind
from chroma_memory.community_store import collection_name_for
from chroma_memory.embedding import (
    close_chroma_client,
    default_embedding_function,
    make_chroma_client,
)
from chroma_memory.server import ServerMemory
from sonality.state import SEED_SNAPSHOT
from tests.chroma_server import ChromaServer, free_port
from tests.integration.conftest import (
    BOB,
    MODEL_CACHE,
    A,
    B,
    chat_requests,
    command,
    make_settings,
    prompt_of,
    say,
)
from tests.integration.test_isolation_and_commands import CANARY, teach_canary
from tests.integration.test_pipeline import ATOMIC_QUESTION, NUCLEAR, STRONG_ARGUMENT
from tests.integration.test_process import bot_env
from tests.pg import PostgresServer

QUERIES = (ATOMIC_QUESTION, "Are raised zebra crossings safer?")
VIEWS = ("beliefs", "history", "snapshot")


def run_migrate(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "migrate", *args],
        env=bot_env(data),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


async def views(runtime: Any) -> dict[str, str]:
    """What moderators see of community A: beliefs, history, snapshot."""
    return {name: (await command(runtime, name)).text for name in VIEWS}


async def recalled(runtime: Any) -> dict[str, list[str]]:
    """The memories each query retrieves in each community, straight from its store."""
    embed = default_embedding_function(MODEL_CACHE)
    found: dict[str, list[str]] = {}
    for community in (A, B):
        store = await asyncio.to_thread(runtime.memory.store_for, community.id, embed)
        for query in QUERIES:
            found[f"{community.id} {query}"] = await asyncio.to_thread(store.retrieve_typed, query)
    return found


def vectors_of(client: Any, community_id: str) -> dict[str, list[float]]:
    """Each memory's vector as float32. Compared with a tolerance of 1e-6: Chroma may
    hand back a cosine collection's vector from its normalized HNSW copy (seen: one
    ulp apart from the vector written), on either side."""
    got = client.get_collection(collection_name_for(community_id)).get(include=["embeddings"])
    return {
        i: np.asarray(v, dtype=np.float32).tolist()
        for i, v in zip(got["ids"], got["embeddings"], strict=True)
    }


async def ask_about_zebras(runtime: Any, anthropic_server: Any) -> str:
    """Bob's question in A, answered; the memories its prompt recalled."""
    reply = await runtime.handle(
        IncomingMessage(community=A, channel_id="c1", user=BOB, text=QUERIES[1])
    )
    assert reply is not None and reply.kind is ReplyKind.ANSWER
    await runtime.drain()
    prompt = prompt_of(chat_requests(anthropic_server)[-1])
    found = re.search(r"<relevant_memories>.*?</relevant_memories>", prompt, re.DOTALL)
    assert found is not None, "no memories recalled"
    assert str(CANARY["summary"]) in found.group(0)
    assert str(NUCLEAR["summary"]) not in found.group(0)  # rolled back: hidden
    return found.group(0)


async def build_community(settings: Any, llm: Any, anthropic_server: Any) -> None:
    """Arguments that moved opinions, an accepted reflection and a rollback in A; a
    second community B with a memory of its own."""
    anthropic_server.brain.ess_rule(**NUCLEAR)
    anthropic_server.brain.ess_rule(**CANARY)
    new_self = SEED_SNAPSHOT + " Lately I have grown fond of careful arguments about safety."
    anthropic_server.brain.reply_rule(contains="current_self_description", text=new_self)
    async with open_runtime(settings, llm=llm) as runtime:
        await teach_canary(runtime)
        await say(runtime, STRONG_ARGUMENT)
        for i in range(3):
            await say(runtime, f"more chat {i}")
        assert (await command(runtime, "reflect")).ok
        assert (await command(runtime, "rollback", "4", "too fast")).ok
        await say(runtime, STRONG_ARGUMENT, community=B)


async def test_a_migrated_community_answers_and_recalls_the_same(
    tmp_path: Path,
    llm: Any,
    anthropic_server: Any,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,
) -> None:
    old_data = tmp_path / "old"
    old = make_settings(old_data, llm=llm)
    await build_community(old, llm, anthropic_server)
    # One stored vector the model would never make for its text (B's first memory, its
    # components reversed): if the command embedded again, this one would not survive.
    local = make_chroma_client(old.resolved_chroma_dir)
    odd = local.get_collection(collection_name_for(B.id))
    first = odd.get(limit=1, include=["embeddings", "documents", "metadatas"])
    stored: Any = first["embeddings"]
    odd_id, odd_vector = first["ids"][0], np.asarray(stored[0])[::-1].tolist()
    odd.upsert(
        ids=[odd_id],
        embeddings=[odd_vector],
        documents=first["documents"],
        metadatas=first["metadatas"],
    )
    close_chroma_client(old.resolved_chroma_dir)
    async with open_runtime(old, llm=llm) as runtime:
        recalled_before = await ask_about_zebras(runtime, anthropic_server)
        before = await views(runtime)
        memories = await recalled(runtime)
        versions = {c.id: await runtime.db.community(c.id).latest_version() for c in (A, B)}
    assert "rollback" in before["history"] and "reflection" in before["history"]
    assert any(str(NUCLEAR["summary"]) in m for m in memories[f"{A.id} {ATOMIC_QUESTION}"])
    local = make_chroma_client(old.resolved_chroma_dir)
    old_vectors = {c.id: vectors_of(local, c.id) for c in (A, B)}

    url = postgres_server.new_database()
    database = chroma_server.fresh_database()
    try:
        # A Chroma server that is not there: the state is copied, the memories are not,
        # and the command says so; running it again finishes the same copy.
        nowhere = f"http://127.0.0.1:{free_port()}"
        failed = run_migrate(
            old_data, "--to-database", url, "--to-chroma", nowhere, "--chroma-database", database
        )
        assert failed.returncode == 2, failed.stderr
        assert "could not reach the Chroma server" in failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1

        done = run_migrate(
            old_data,
            "--to-database",
            url,
            "--to-chroma",
            chroma_server.url,
            "--chroma-database",
            database,
        )
        assert done.returncode == 0, done.stderr
        assert "resuming the unfinished copy" in done.stdout
        assert "personality_versions:" in done.stdout and "memories in" in done.stdout

        # The target now holds data: a third run is refused and changes nothing.
        again = run_migrate(
            old_data,
            "--to-database",
            url,
            "--to-chroma",
            chroma_server.url,
            "--chroma-database",
            database,
        )
        assert again.returncode == 2
        assert "already holds data" in again.stderr

        # The vectors were copied, not computed again.
        remote = ServerMemory(chroma_server.url, database=database)
        try:
            for community in (A, B):
                moved = vectors_of(remote.chroma.client, community.id)
                assert moved.keys() == old_vectors[community.id].keys()
                for key, vector in moved.items():
                    assert np.allclose(vector, old_vectors[community.id][key], atol=1e-6)
            assert np.allclose(moved[odd_id], odd_vector, atol=1e-6)
        finally:
            remote.close()

        new = make_settings(
            tmp_path / "new",  # an empty data directory: everything comes from the servers
            llm=llm,
            DATABASE_URL=url,
            CHROMA_URL=chroma_server.url,
            SONALITY_CHROMA_DATABASE=database,
        )
        async with open_runtime(new, llm=llm) as runtime:
            assert runtime.db.engine_name == "postgresql"
            assert await views(runtime) == before
            assert await recalled(runtime) == memories
            for c in (A, B):
                assert await runtime.db.community(c.id).latest_version() == versions[c.id]

            # Asked again, it recalls the same memories as before the move (the
            # rolled-back nuclear argument still hidden), plus the one that first asking
            # left, and learns from the next version number on.
            again_recalled = await ask_about_zebras(runtime, anthropic_server)
            left = f"- {QUERIES[1]}\n</relevant_memories>"
            assert again_recalled == recalled_before.replace("</relevant_memories>", left)
            assert await runtime.db.community(A.id).latest_version() == versions[A.id] + 1  # type: ignore[operator]
            assert not (tmp_path / "new" / "chromadb").exists()

        # The append-only history holds on the target as it did in the file.
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in (
                "UPDATE personality_versions SET cause = 'edited' WHERE version = 1",
                "DELETE FROM personality_versions WHERE version = 1",
            ):
                with pytest.raises(psycopg.errors.IntegrityError, match="append-only"):
                    conn.execute(statement)
            marker = conn.execute("SELECT to_regclass('sonality_transfer')").fetchone()
            assert marker == (None,)
    finally:
        postgres_server.drop(url)


def test_migrate_refuses_what_it_cannot_copy_in_one_line(tmp_path: Path) -> None:
    """Nothing to copy, servers already configured as the source, a URL that is not
    PostgreSQL, a running bot: each is one line and exit code 2, before anything is
    written anywhere."""
    data = tmp_path / "data"
    url = "postgresql://sonality:hunter2@127.0.0.1:1/sonality"
    nothing = run_migrate(data, "--to-database", url)
    assert nothing.returncode == 2 and "nothing to migrate" in nothing.stderr

    data.mkdir()
    (data / "sonality.sqlite3").write_bytes(b"")
    wrong = run_migrate(data, "--to-database", "mysql://x@y/z")
    assert wrong.returncode == 2 and "must be a postgresql://" in wrong.stderr

    configured = subprocess.run(
        [sys.executable, "-m", "app", "migrate", "--to-database", url],
        env=bot_env(data, DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert configured.returncode == 2 and "unset DATABASE_URL" in configured.stderr
    assert "hunter2" not in configured.stderr

    with DataDirLock.acquire(data):  # as a running bot holds it
        running = run_migrate(data, "--to-database", url)
    assert running.returncode == 2 and "stop it first" in running.stderr
    for refused in (nothing, wrong, configured, running):
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
