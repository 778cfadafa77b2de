"""`storage.transfer`: a SQLite file with a row in every table, copied into PostgreSQL.

The source is filled through the bot's own storage API, the target is an empty
database on the session's real PostgreSQL; the copy is compared table by table, row by
row, and then used by the bot's PostgreSQL code.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from cryptography.fernet import Fernet

from sonality.evidence import EvidenceStep
from sonality.llm import Usage
from sonality.store import AuditEvent, Episode, UsageRecord
from storage import Database, transfer
from storage.channels import ChannelMode
from storage.models import StorageError
from storage.spend import MemberSpend
from tests.pg import PostgresServer
from tests.storage.conftest import at, commit_of, record

INSTALL = {"enterprise_id": None, "team_id": "T1", "user_id": "U1", "is_enterprise_install": False}
TOKEN = "xoxb-not-a-real-token-but-secret"


async def fill(path: Path, key: str) -> None:
    """A row in every table the schema has (an erased community included)."""
    db = await Database.open(path)
    try:
        await db.use_secret_key(key)
        for cid in ("slack:T1", "discord:9", "discord:gone"):
            store = db.community(cid)
            await store.commit(commit_of(0, cause="seed"))
            for version in (1, 2, 3):
                iid = f"{cid}-{version}"
                await store.record_interaction(record(iid, f"message {version}", version))
                commit = commit_of(
                    version,
                    interaction_id=iid,
                    events=[AuditEvent(kind="ess", interaction=version, payload={"v": version})],
                    usage=[UsageRecord(purpose="reply", model="m", usage=Usage(input_tokens=7))],
                )
                commit = commit.model_copy(
                    update={
                        "episodes": [Episode(id=f"e-{iid}", user_message="hi", summary="s")],
                        "evidence": [EvidenceStep(kind="decay", interaction=version, rate=0.1)],
                    }
                )
                await store.commit(commit)
            await db.append_exchange(cid, "u1", "hello", "hi there", at(5))
            await db.record_moderator_action(
                cid, actor_id="u1", actor_name="Ada", action="reflect", allowed=True
            )
            await db.set_budget_override(cid, 2.5, set_by="u1")
        await db.mark_removed("discord:gone", at(10), timedelta(days=1))
        await db.erase_community("discord:gone", at(20))
        await db.mark_removed("discord:9", at(30), timedelta(days=7))
        await db.begin_forget("slack:T1", "u1", "u1", "asked", at(40))
        await db.begin_deletion("discord:9", "discord:77", "deleted", at(45))
        await db.mark_event_seen("slack", "Ev1", at(50), 10**9)
        await db.save_installation(INSTALL, {"bot_token": TOKEN, "team_id": "T1"})
        await db.issue_oauth_state("state-1", at(10**7))
        await db.flood_hit("slack:T1", "u2", at(60), timedelta(seconds=60))
        day = at(60).date()
        await db.add_member_spend(
            [MemberSpend(community_id="slack:T1", day=day, member_id="u2", usd=0.25, calls=1)]
        )
        await db.claim_share_notice("slack:T1", day, "u2")
        await db.record_feedback("slack:T1", "1700000000.000100", "u2", True, at(60))
        await db.set_channel_mode(
            "discord:9",
            "123",
            ChannelMode.FREE,
            channel_name="general",
            set_by_id="u1",
            set_by_name="Ada",
            at=at(60),
        )
        await db.claim_bot_reply("slack:T1", "C1", 3)
    finally:
        await db.close()


def rows(conn: object, table: str, postgres: bool) -> list[tuple[object, ...]]:
    cur = conn.execute(f'SELECT * FROM "{table}"')  # type: ignore[attr-defined]
    found = [tuple(r) for r in cur.fetchall()]
    return sorted(found, key=repr)


async def test_every_row_of_every_table_arrives_and_the_bot_uses_it(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    key = Fernet.generate_key().decode()
    path = tmp_path / "bot.sqlite3"
    await fill(path, key)
    url = postgres_server.new_database()
    try:
        await transfer.prepare(path, url)
        assert transfer.begin(path, url) is False
        copies = transfer.copy_tables(path, url)
        report = transfer.check(path, url, copies, resumed=False)
        assert {t.name for t in report.tables} >= {
            "installations",
            "forget_requests",
            "community_erasures",
            "evidence_log",
            "episode_outbox",
            "oauth_states",
            "seen_events",
            "usage_daily",
        }
        with sqlite3.connect(path) as source, psycopg.connect(url) as target:
            for copy in copies:
                assert copy.rows > 0, f"the test left {copy.name} empty"
                assert rows(target, copy.name, True) == rows(source, copy.name, False), copy.name
        assert report.newest_versions == {"slack:T1": 3, "discord:9": 3}

        # Running again before the copy is finished resumes it, duplicating nothing.
        assert transfer.begin(path, url) is True
        transfer.check(path, url, transfer.copy_tables(path, url), resumed=True)
        transfer.finish(url)

        db = await Database.open_url(url)
        try:
            await db.use_secret_key(key)  # the same key opens the copied installation
            found = await db.find_installation(None, "T1")
            assert found is not None and found["bot_token"] == TOKEN
            # New rows get ids past every id the file ever handed out (the erased
            # community's too), and the history goes on from the copied version.
            store = db.community("discord:9")
            await store.commit(commit_of(4, events=[AuditEvent(kind="ess", interaction=4)]))
            assert await store.latest_version() == 4
        finally:
            await db.close()
        with sqlite3.connect(path) as source, psycopg.connect(url) as target:
            (used,) = source.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'audit_events'"
            ).fetchone()
            newest = target.execute("SELECT MAX(id) FROM audit_events").fetchone()
            assert newest == (used + 1,)

        # The copy is done: the target now counts as holding data.
        with pytest.raises(transfer.TransferRefused, match="already holds data"):
            transfer.begin(path, url)
    finally:
        postgres_server.drop(url)


async def test_a_copy_of_another_file_in_progress_is_refused(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    key = Fernet.generate_key().decode()
    first, second = tmp_path / "a.sqlite3", tmp_path / "b.sqlite3"
    await fill(first, key)
    await fill(second, key)
    url = postgres_server.new_database()
    try:
        await transfer.prepare(first, url)
        transfer.begin(first, url)
        with pytest.raises(transfer.TransferRefused, match="unfinished copy of another"):
            transfer.begin(second, url)
    finally:
        postgres_server.drop(url)


async def test_a_row_postgresql_cannot_hold_stops_the_copy_naming_its_table(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    """SQLite text may hold a NUL character, PostgreSQL text may not: the copy stops
    with a StorageError naming the table, and running it again resumes the same copy."""
    path = tmp_path / "bot.sqlite3"
    db = await Database.open(path)
    try:
        await db.append_exchange("discord:1", "u1", "nul \x00 inside", "ok", at(1))
    finally:
        await db.close()
    url = postgres_server.new_database()
    try:
        await transfer.prepare(path, url)
        transfer.begin(path, url)
        with pytest.raises(StorageError, match="copying table conversation_turns failed"):
            transfer.copy_tables(path, url)
        assert transfer.begin(path, url) is True
    finally:
        postgres_server.drop(url)
