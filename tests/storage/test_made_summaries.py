"""A summary the bot writes itself ("The sender wrote no words." for a picture alone,
"A message of N words that could not be summarised.") is the same for every member's
message and quotes none: taking back one member's message, or forgetting one member,
must leave another member's identical summary as it is."""

from __future__ import annotations

import json

import pytest

from sonality.ess import WORDLESS_SUMMARY, fallback_summary, made_summary
from sonality.evidence import EvidenceStep, RecordedESS
from sonality.state import SpongeState
from sonality.store import AuditEvent, InteractionRecord, Speaker, StateCommit
from storage import Database

from .conftest import Backend, at

CID = "discord:42"


async def two_members_with(db: Database, summary: str) -> None:
    """Alice's message then Bob's, each rated with `summary`."""
    store = db.community(CID)
    await store.commit(StateCommit(state=SpongeState(version=0), cause="seed", change="seed"))
    for v, (iid, who) in enumerate([("iA", "alice"), ("iB", "bob")], start=1):
        record = InteractionRecord(
            id=iid,
            speaker=Speaker(id=who, name=who.title()),
            message="",
            reply="a nice picture",
            created_at=at(v),
            model="m",
            message_ref=f"discord:{v}",
        )
        await store.record_interaction(record)
        rated = RecordedESS(
            score=0.0,
            reasoning_type="no_argument",
            source_reliability="not_applicable",
            internal_consistency=True,
            novelty=0.0,
            topics=(),
            summary=summary,
            opinion_direction="neutral",
        )
        step = EvidenceStep(
            kind="message", interaction=v, interaction_id=iid, member=who, ess=rated
        )
        payload = {"interaction_id": iid, "speaker": who, "summary": summary}
        await store.commit(
            StateCommit(
                state=SpongeState(version=v, interaction_count=v),
                cause="interaction",
                change="chat",
                interaction_id=iid,
                evidence=[step],
                events=[AuditEvent(kind="ess", interaction=v, payload=payload)],
            )
        )


def summaries_of(backend: Backend, who: str) -> list[str]:
    payloads = [json.loads(str(r[0])) for r in backend.sql("SELECT payload_json FROM audit_events")]
    return [p["summary"] for p in payloads if p.get("speaker") == who]


def test_the_bots_own_summaries_are_known_as_such() -> None:
    assert made_summary(WORDLESS_SUMMARY)
    assert made_summary(fallback_summary("two words")) and made_summary(fallback_summary("one"))
    assert not made_summary("The sender cites a survey of 40 trials.")
    assert not made_summary("A message of many words that could not be summarised.")


@pytest.mark.parametrize("summary", [WORDLESS_SUMMARY, fallback_summary("it is what it is")])
async def test_taking_back_one_message_leaves_anothers_same_summary(
    db: Database, backend: Backend, summary: str
) -> None:
    await two_members_with(db, summary)
    [deletion] = await db.begin_deletion(CID, "discord:1", "deleted", at(10))
    await db.erase_message(deletion, await db.message_words(CID, "iA"), at(11))
    assert summaries_of(backend, "bob") == [summary]


async def test_forgetting_one_member_leaves_anothers_same_summary(
    db: Database, backend: Backend
) -> None:
    await two_members_with(db, WORDLESS_SUMMARY)
    request = await db.begin_forget(CID, "alice", "alice", "", at(10))
    await db.erase_member(request, await db.member_words(CID, "alice"), at(11))
    assert summaries_of(backend, "bob") == [WORDLESS_SUMMARY]
