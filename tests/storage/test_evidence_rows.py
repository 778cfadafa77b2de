"""The evidence log is kept for good, so its rows hold each fact once."""

from __future__ import annotations

import json

from sonality.evidence import DECAY, MESSAGE, ROLLBACK, EvidenceStep, RecordedESS
from storage import Database

from .conftest import Backend, commit_of

CID = "discord:1"

RATED = RecordedESS(
    score=0.7312345678901234,
    reasoning_type="empirical_data",
    source_reliability="peer_reviewed",
    internal_consistency=True,
    novelty=0.4,
    topics=("energy", "nuclear"),
    summary="The sender cites a study on reactor safety.",
    opinion_direction="supports",
)


async def log_steps(db: Database, steps: list[EvidenceStep]) -> None:
    """Seed, then commit each step as versions 1, 2, ..."""
    store = db.community(CID)
    await store.commit(commit_of(0))
    for version, step in enumerate(steps, start=1):
        await store.commit(commit_of(version).model_copy(update={"evidence": [step]}))


async def test_steps_read_back_equal_and_their_json_leaves_out_the_columns(
    db: Database, backend: Backend
) -> None:
    steps = [
        EvidenceStep(kind=MESSAGE, interaction=1, interaction_id="i1", member="U1", ess=RATED),
        EvidenceStep(kind=DECAY, interaction=1, rate=0.15),
        EvidenceStep(kind=ROLLBACK, interaction=1, target_version=0),
    ]
    await log_steps(db, steps)

    read = await db.community(CID).evidence()
    assert read == [s.model_copy(update={"version": v}) for v, s in enumerate(steps, start=1)]
    rows = [json.loads(str(r[0])) for r in backend.sql("SELECT step_json FROM evidence_log")]
    for row in rows:
        assert not {"kind", "version", "interaction_id", "member"} & set(row)
    assert "used_defaults" not in rows[0]["ess"]  # a default, left out
    assert rows[1] == {"interaction": 1, "rate": 0.15}


async def test_a_row_written_whole_by_an_earlier_release_still_reads(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    await store.commit(commit_of(0))
    step = EvidenceStep(kind=MESSAGE, interaction=1, interaction_id="i1", member="U1", ess=RATED)
    await store.commit(commit_of(1).model_copy(update={"evidence": [step]}))
    whole = step.model_copy(update={"version": 1}).model_dump_json()
    backend.run("UPDATE evidence_log SET step_json = ?", (whole,))
    assert await store.evidence() == [step.model_copy(update={"version": 1})]


async def test_a_chat_step_stores_only_what_differs_from_the_usual_chat_answer(
    db: Database, backend: Backend
) -> None:
    """Most messages are chat: their row holds the score, topics and summary only, and
    reads back whole; an unusual value in a usual field is kept."""
    chat = RecordedESS(
        score=0.02,
        reasoning_type="no_argument",
        source_reliability="not_applicable",
        internal_consistency=True,
        novelty=0.0,
        topics=("small_talk",),
        summary="Do you like puzzles?",
        opinion_direction="neutral",
    )
    odd = chat.model_copy(update={"internal_consistency": False, "novelty": 0.5})
    steps = [
        EvidenceStep(kind=MESSAGE, interaction=1, interaction_id="i1", member="U1", ess=chat),
        EvidenceStep(kind=MESSAGE, interaction=7, interaction_id="i2", member="U2", ess=odd),
    ]
    await log_steps(db, steps)

    assert await db.community(CID).evidence() == [
        s.model_copy(update={"version": v}) for v, s in enumerate(steps, start=1)
    ]
    rows = [json.loads(str(r[0])) for r in backend.sql("SELECT step_json FROM evidence_log")]
    assert rows[0] == {
        "ess": {"score": 0.02, "topics": ["small_talk"], "summary": "Do you like puzzles?"}
    }
    assert rows[1]["interaction"] == 7  # not the version (2), so kept
    assert rows[1]["ess"]["internal_consistency"] is False
    assert rows[1]["ess"]["novelty"] == 0.5


async def test_the_members_data_lists_their_evidence_after_the_audit_trail_is_gone(
    db: Database, backend: Backend
) -> None:
    await log_steps(
        db,
        [
            EvidenceStep(kind=MESSAGE, interaction=1, interaction_id="i1", member="U1", ess=RATED),
            EvidenceStep(kind=MESSAGE, interaction=2, interaction_id="i2", member="U2", ess=RATED),
            EvidenceStep(kind=DECAY, interaction=2, rate=0.15),
        ],
    )
    backend.run("DELETE FROM audit_events")  # as audit retention does after a year
    rows = await db.member_rows(CID, "U1")
    assert rows.ratings == ()
    [kept] = rows.evidence
    assert (kept.interaction_id, kept.version, kept.summary) == ("i1", 1, RATED.summary)
    assert (kept.score, kept.topics, kept.opinion_direction) == (
        RATED.score,
        RATED.topics,
        "supports",
    )


async def test_a_message_s_first_version_and_the_newest_version_of_some_causes(
    db: Database,
) -> None:
    """What a deletion asks to replay from the stored state before its message: where
    the message was learned, whether a replay came after, and the log from a version."""
    store = db.community(CID)
    steps = [
        EvidenceStep(kind=MESSAGE, interaction=1, interaction_id="i1", member="U1", ess=RATED),
        EvidenceStep(kind=MESSAGE, interaction=2, interaction_id="i2", member="U2", ess=RATED),
        EvidenceStep(kind=DECAY, interaction=2, rate=0.15),
        EvidenceStep(kind=MESSAGE, interaction=3, interaction_id="i1", member="U1", ess=RATED),
    ]
    await log_steps(db, steps)
    assert await store.learned_at("i1") == 1  # its first step's version
    assert await store.learned_at("i2") == 2
    assert await store.learned_at("never") is None
    assert [s.version for s in await store.evidence(3)] == [3, 4]
    assert await store.evidence(5) == []
    assert await store.last_version_of({"forget-me", "rollback"}) == 0
    assert await store.last_version_of(()) == 0
    await store.commit(commit_of(5).model_copy(update={"cause": "forget-me"}))
    await store.commit(commit_of(6))
    assert await store.last_version_of({"forget-me", "rollback"}) == 5
    assert await db.community("discord:2").last_version_of({"forget-me"}) == 0
