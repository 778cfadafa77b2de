"""Retention of a member's words (issue 11, item 5), with a controllable clock: once a
message is older than the message retention, no SQLite table holds its text or the
reply, wherever it was copied (outbox, conversation buffer, unwritten episode, a
fallback summary in the audit trail and the evidence log); newer text and everything
the personality's history needs stay."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sonality.evidence import EvidenceStep, RecordedESS
from sonality.store import AuditEvent, Episode, InteractionRecord, Speaker, StateCommit, utcnow
from storage import Database, RetentionPolicy

from .conftest import Backend, state

CID = "slack:T1"
POLICY = RetentionPolicy(message_days=90, audit_days=365)
OLD = "wombatvelvet"  # words of the old message and its reply
NEW = "pangolinsilk"  # words of a message 60 days younger


def tables_of(backend: Backend) -> list[str]:
    if backend.postgres:
        query = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    else:
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    return sorted(str(r[0]) for r in backend.sql(query))


def rows_with(backend: Backend, word: str) -> list[str]:
    """Every row of every table whose text holds `word` (as "table: row")."""
    found = []
    for table in tables_of(backend):
        for row in backend.sql(f'SELECT * FROM "{table}"'):
            if any(word in str(value) for value in row):
                found.append(f"{table}: {row}")
    return found


def rating(summary: str, *, fallback: bool) -> RecordedESS:
    return RecordedESS(
        score=0.0 if fallback else 0.6,
        reasoning_type="no_argument" if fallback else "logical_argument",
        source_reliability="not_applicable" if fallback else "informed_opinion",
        internal_consistency=not fallback,
        novelty=0.0 if fallback else 0.5,
        topics=() if fallback else ("tea",),
        summary=summary,
        opinion_direction="neutral" if fallback else "supports",
        used_defaults=fallback,
    )


async def learn(
    db: Database, version: int, iid: str, text: str, at: datetime, ess: RecordedESS
) -> None:
    """One message stored, rated and learned as the agent commits it (episode unwritten)."""
    store = db.community(CID)
    await store.record_interaction(
        InteractionRecord(
            id=iid,
            speaker=Speaker(id="U1", name="Ada"),
            message=f"{text} says the member",
            reply=f"{text} says the bot",
            created_at=at,
        )
    )
    payload: dict[str, object] = {"interaction_id": iid, "speaker": "U1"}
    payload |= {"summary": ess.summary, "used_defaults": ess.used_defaults}
    await store.commit(
        StateCommit(
            state=state(version),
            cause="interaction",
            change=f"v{version}",
            interaction_id=iid,
            events=[AuditEvent(kind="ess", interaction=version, payload=payload, created_at=at)],
            episodes=[
                Episode(
                    id=iid,
                    user_message=f"{text} says the member",
                    agent_response=f"{text} says the bot",
                    summary="The sender talks about tea.",
                )
            ],
            evidence=[
                EvidenceStep(
                    kind="message", interaction=version, interaction_id=iid, member="U1", ess=ess
                )
            ],
        )
    )
    await db.append_exchange(CID, "U1", f"{text} says the member", f"{text} says the bot", at)


async def test_no_table_keeps_a_members_words_past_the_message_retention(
    db: Database, backend: Backend
) -> None:
    now = utcnow()
    await db.community(CID).commit(StateCommit(state=state(0), cause="seed", change="seed"))
    # The old message could not be rated: its summary is its own first words.
    # (Both are committed now, as the store stamps commits with the real time.)
    before = now - timedelta(days=60)
    await learn(db, 1, "i-old", OLD, before, rating(f"{OLD} says the member", fallback=True))
    await learn(db, 2, "i-new", NEW, now, rating(f"{NEW} fallback", fallback=True))
    assert len(rows_with(backend, OLD)) >= 5  # outbox, turns, episode, audit, evidence

    early = await db.apply_retention(now + timedelta(days=29), POLICY)
    assert early.total == 0
    assert rows_with(backend, OLD)

    report = await db.apply_retention(now + timedelta(days=31), POLICY)
    assert rows_with(backend, OLD) == []
    assert report.texts_erased == 1 and report.conversation_turns == 2
    assert report.episode_texts_erased == 1 and report.quoted_summaries_erased == 2
    # The younger message is untouched in every table it was copied to.
    assert {row.split(":")[0] for row in rows_with(backend, NEW)} == {
        "interactions",
        "conversation_turns",
        "episode_outbox",
        "audit_events",
        "evidence_log",
    }
    [(episode_json,)] = backend.sql(
        "SELECT episode_json FROM episode_outbox WHERE episode_id = 'i-old'"
    )
    # What a replay and the memory write need stays: the rating and the summary.
    [step] = [s for s in await db.community(CID).evidence() if s.interaction_id == "i-old"]
    assert step.ess is not None and step.ess.used_defaults and step.member == "U1"
    assert step.ess.summary == ""  # it quoted the member: erased with the message
    assert json.loads(str(episode_json))["summary"] == "The sender talks about tea."
    # A second run has nothing left to do; the history is whole.
    assert (await db.apply_retention(now + timedelta(days=31), POLICY)).total == 0
    assert [v.version for v in await db.community(CID).versions()] == [2, 1, 0]


async def test_a_rated_summary_is_kept_it_does_not_quote_the_member(
    db: Database, backend: Backend
) -> None:
    now = utcnow()
    await db.community(CID).commit(StateCommit(state=state(0), cause="seed", change="seed"))
    summary = "The sender argues that tea is better brewed cold."
    await learn(db, 1, "i-1", OLD, now, rating(summary, fallback=False))
    report = await db.apply_retention(now + timedelta(days=91), POLICY)
    assert report.quoted_summaries_erased == 0 and rows_with(backend, OLD) == []
    assert any(summary in row for row in rows_with(backend, "brewed cold"))
    assert any(row.startswith("evidence_log") for row in rows_with(backend, "brewed cold"))
