"""Deleted messages' storage side on both engines (issue 25, item 4): the journal row
refuses an answer still being written, the message's rows go and its words leave the
rows that stay (past versions through the redaction gate, which closes again), and the
rows that took nothing back are pruned after a day.

(The replay, Chroma and the platforms are the bot's part: tests/integration/
test_message_deletion.py, test_deletion_discord.py, test_deletion_slack.py.)
"""

from __future__ import annotations

from datetime import timedelta

from sonality.evidence import EvidenceStep, RecordedESS
from sonality.state import StagedOpinionUpdate
from sonality.store import AuditEvent, Episode, InteractionRecord, Speaker, StateCommit
from storage import Database, RetentionPolicy
from storage.base import execute
from storage.deletion import DeletionEntry
from storage.forget import MemberWords

from .conftest import Backend, at, state
from .test_forget_rows import rows_holding

CID = "discord:42"
REF = "discord:1234567890123"
WORD = "wombatquill"


def answered(
    interaction_id: str, minutes: float, ref: str = REF, text: str = f"the {WORD} study says so"
) -> InteractionRecord:
    return InteractionRecord(
        id=interaction_id,
        speaker=Speaker(id="u1", name="Ada"),
        message=text,
        reply="interesting",
        created_at=at(minutes),
        model="m",
        message_ref=ref,
    )


async def test_an_answer_asked_before_the_deletion_is_refused_one_asked_after_is_kept(
    db: Database,
) -> None:
    store = db.community(CID)
    assert await db.begin_deletion(CID, REF, "deleted", at(5)) == []  # nothing kept yet
    assert await store.record_interaction(answered("i-old", 4)) is False
    assert (
        await db.append_exchange(CID, "u1", "hi", "hello", at(6), asked_at=at(4), message_ref=REF)
        is False
    )
    # Another message of the same member, and the same message answered after an edit.
    assert await store.record_interaction(answered("i-other", 4, ref="discord:99")) is True
    assert await store.record_interaction(answered("i-new", 6)) is True
    assert (
        await db.append_exchange(CID, "u1", "hi", "hello", at(7), asked_at=at(6), message_ref=REF)
        is True
    )
    assert await db.communities_holding(REF) == [CID]
    assert [m for _, m in await db.kept_messages(REF)] == [f"the {WORD} study says so"]


async def test_an_exchange_kept_without_an_interaction_leaves_the_buffer(
    db: Database, backend: Backend
) -> None:
    """A message answered but never recorded for learning (another bot's) is in the
    conversation buffer only: its deletion takes that exchange out too, and no other."""
    await db.append_exchange(CID, "bot-7", f"the {WORD} study", "ok", at(1), message_ref=REF)
    await db.append_exchange(CID, "bot-7", "a later one", "fine", at(2), message_ref="discord:9")
    await db.append_exchange("discord:43", "bot-7", WORD, "ok", at(1), message_ref=REF)
    assert await db.begin_deletion(CID, REF, "deleted", at(3)) == []
    assert await db.recent_turns(CID, "bot-7", max_turns=10, max_chars=10_000) == [
        ("user", "a later one"),
        ("assistant", "fine"),
    ]
    # Another community's rows are that community's to take back.
    assert (
        len(backend.sql("SELECT id FROM conversation_turns WHERE community_id = 'discord:43'")) == 2
    )


async def test_an_open_deletion_hides_its_message_from_learning(db: Database) -> None:
    store = db.community(CID)
    await store.commit(StateCommit(state=state(0), cause="seed", change="seed"))
    await store.record_interaction(answered("i1", 1))
    [deletion] = await db.begin_deletion(CID, REF, "deleted", at(2))
    assert deletion.interaction_id == "i1" and deletion.version is None
    assert await store.pending_interactions() == []
    assert await db.open_deletions() == [deletion]


def rated(interaction_id: str, summary: str, topics: tuple[str, ...]) -> EvidenceStep:
    return EvidenceStep(
        kind="message",
        interaction=1,
        interaction_id=interaction_id,
        member="u1",
        ess=RecordedESS(
            score=0.8,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
            internal_consistency=True,
            novelty=0.8,
            topics=topics,
            summary=summary,
            opinion_direction="supports",
        ),
    )


async def learn(
    db: Database, record: InteractionRecord, version: int, summary: str, topic: str
) -> None:
    """`record` answered and committed as `version`, its argument rated for `topic`."""
    store = db.community(CID)
    await store.record_interaction(record)
    await store.commit(
        StateCommit(
            state=state(version),
            cause="interaction",
            change="ESS 0.80",
            interaction_id=record.id,
            evidence=[rated(record.id, summary, (topic,))],
        )
    )


async def test_a_deleted_message_leaves_no_row_or_word_and_the_gate_closes(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    own = f"{WORD}_method"  # a topic only the deleted message produced
    await store.commit(StateCommit(state=state(0), cause="seed", change="seed"))
    survey = answered("i0", 0, ref="discord:5", text="a survey says so")
    await learn(db, survey, 1, "Ada cites a survey.", "remote_work")
    await store.record_interaction(answered("i1", 1))
    await db.append_exchange(CID, "u1", f"the {WORD} study", "ok", at(1), message_ref=REF)
    summary = f"Ada cites the {WORD} study."
    insight = f"I weigh the {WORD} study."
    learned = state(2)
    learned.pending_insights = [insight]
    learned.staged_opinion_updates = [
        StagedOpinionUpdate(
            topic=topic,
            signed_magnitude=0.05,
            staged_at=2,
            due_interaction=5,
            provenance=f"ESS 0.80: {summary}",
            interaction_id="i1",
            member="u1",
            version=2,
        )
        for topic in ("remote_work", own)
    ]
    await store.commit(
        StateCommit(
            state=learned,
            cause="interaction",
            change=f"ESS 0.80 | staged remote_work +0.050, {own} +0.050 | insight noted",
            interaction_id="i1",
            events=[
                AuditEvent(
                    kind="ess",
                    interaction=2,
                    payload={
                        "interaction_id": "i1",
                        "speaker": "u1",
                        "summary": summary,
                        "insight": insight,
                        "topics": ["remote_work", own],
                    },
                )
            ],
            episodes=[Episode(id="i1", user_message=f"the {WORD} study", summary=summary)],
            evidence=[rated("i1", summary, ("remote_work", own))],
        )
    )
    [deletion] = await db.begin_deletion(CID, REF, "deleted", at(2))
    words = await db.message_words(CID, "i1")
    assert set(words.texts) >= {summary, insight}
    assert words.topics == (own,)  # remote_work is another message's too
    # A replayed version (as the agent commits it), then the erase.
    await store.commit(StateCommit(state=state(3), cause="message-deleted", change="replayed"))
    await db.set_deletion_version(deletion.id, 3)
    assert await db.erase_message(deletion, words, at(3)) > 0
    for needle in (WORD, "i1", "1234567890123"):
        assert rows_holding(backend, needle) == [], needle
    assert await db.open_deletions() == []
    [(label, version, interaction_id)] = backend.sql(
        "SELECT label, version, interaction_id FROM message_deletions"
    )
    assert (version, interaction_id) == (3, None)
    # The past version names the label, not the interaction; its own topic is gone.
    old = await store.state_at(2)
    assert old is not None and old.pending_insights == ["(forgotten)"]
    [update] = old.staged_opinion_updates
    assert (update.topic, update.interaction_id) == ("remote_work", label)
    assert update.provenance == "ESS 0.80: (forgotten)"
    assert await db.community_members(CID)  # the member's other message is still there
    assert await db.deletions_after(CID, 2) and not await db.deletions_after(CID, 3)
    # The gate is closed again: a version cannot be rewritten.
    try:
        backend.run("UPDATE personality_versions SET change = 'x' WHERE community_id = ?", (CID,))
    except backend.integrity_error:
        pass
    else:
        raise AssertionError("a version was rewritten outside a redaction")


async def test_rows_that_took_nothing_back_are_pruned_after_a_day_and_only_those(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    await store.commit(StateCommit(state=state(0), cause="seed", change="seed"))
    await db.begin_deletion(CID, "discord:1", "deleted", at(0))
    await store.record_interaction(answered("i1", 0, ref="discord:2"))
    [taken] = await db.begin_deletion(CID, "discord:2", "deleted", at(1))
    await db.set_deletion_version(taken.id, 1)
    await db.erase_message(taken, MemberWords(), at(1))
    # An answer taken back before anything was learned from it: no version, but the
    # journal file lists it, and a start must find its row (or match it all again).
    await store.record_interaction(answered("i2", 0, ref="discord:3"))
    [unlearned] = await db.begin_deletion(CID, "discord:3", "edited", at(1))
    await db.erase_message(unlearned, MemberWords(), at(1))
    policy = RetentionPolicy()
    report = await db.apply_retention(at(0) + timedelta(hours=23), policy)
    assert report.message_deletions == 0
    report = await db.apply_retention(at(0) + timedelta(hours=25), policy)
    assert report.message_deletions == 1
    assert sorted(
        backend.sql("SELECT label, version FROM message_deletions"), key=lambda r: str(r[1])
    ) == [(taken.label, 1), (unlearned.label, None)]


async def test_a_deletion_a_restored_database_lacks_is_journaled_again_from_its_entry(
    db: Database,
) -> None:
    """What `restore` and a start do with the journal file's entry of a deletion made
    after the backup: the answers it names, and only those, get an open row (finished
    on start), the buffered exchange goes, and an entry already known changes nothing."""
    store = db.community(CID)
    await store.record_interaction(answered("i-del", 1))
    await store.record_interaction(answered("i-keep", 2, ref="discord:77"))
    assert await db.append_exchange(CID, "u1", "hi", "hello", at(3), message_ref=REF)
    assert await db.append_exchange(CID, "u1", "yo", "hey", at(3), message_ref="discord:77")
    # The entry as the journal file keeps it: another database's row, copied out.
    elsewhere = await db.begin_deletion("discord:other", REF, "deleted", at(4))
    assert elsewhere == []  # (nothing kept there: only its key and label are used)
    [(key,)] = await db._fetchall(
        "SELECT message_key FROM message_deletions WHERE community_id = 'discord:other'"
    )
    entry = DeletionEntry(label="message-abc123", key=str(key), cause="deleted", at=at(4))
    assert await db.rejournal_deletions([entry]) == []  # that key names another community
    # Noted, so the next start does not match it against every kept message again.
    assert ("message-abc123", "") in await db._fetchall(
        "SELECT label, community_id FROM message_deletions"
    )

    [row] = await db.begin_deletion(CID, REF, "edited", at(5))
    mine = DeletionEntry(label="message-def456", key=row.message_key, cause="edited", at=at(5))
    await db._run_write(lambda conn: execute(conn, "DELETE FROM message_deletions", ()))
    await db.append_exchange(CID, "u1", "hi", "hello", at(6), message_ref=REF)  # as restored

    assert await db.rejournal_deletions([entry, mine]) == ["message-def456"]
    [open_row] = await db.open_deletions()
    assert (open_row.interaction_id, open_row.label, open_row.cause) == (
        "i-del",
        "message-def456",
        "edited",
    )
    assert open_row.started_at == at(5)
    turns = await db._fetchall("SELECT message_ref FROM conversation_turns")
    assert {str(r[0]) for r in turns} == {"discord:77"}  # the deleted one's exchange went
    assert await db.rejournal_deletions([entry, mine]) == []  # known now: nothing twice
    assert len(await db.open_deletions()) == 1
    # Retention prunes only rows that took back no answer: the note of `entry` stays.
    await db.apply_retention(at(4) + timedelta(days=400), RetentionPolicy())
    assert [("message-abc123",)] == await db._fetchall(
        "SELECT label FROM message_deletions WHERE community_id = ''"
    )


async def test_being_erased_lists_what_unfinished_deletions_and_forget_mes_will_erase(
    db: Database,
) -> None:
    """What a replay must leave out while another one's rows wait to be erased
    (`SonalityAgent._replayed`): open deletions' messages, and members being forgotten
    with the version that forgot them; nothing once each is finished, nothing of
    another community."""
    store = db.community(CID)
    await store.commit(StateCommit(state=state(0), cause="seed", change="seed"))
    await store.record_interaction(answered("i1", 0, ref="discord:2"))
    await store.record_interaction(answered("i2", 0, ref="discord:3"))
    assert (await store.being_erased()).interactions == frozenset()

    [first] = await db.begin_deletion(CID, "discord:2", "deleted", at(1))
    await db.begin_deletion("discord:43", "discord:3", "deleted", at(1))  # not kept there
    await db.begin_forget(CID, "u-bob", "mod", "", at(1))
    carol = await db.begin_forget(CID, "u-carol", "mod", "", at(1))
    await db.set_forget_version(carol.id, 7)
    await db.begin_forget("discord:43", "u-dave", "mod", "", at(1))

    erasing = await store.being_erased()
    assert erasing.interactions == {"i1"}
    assert erasing.members == {"u-bob": None, "u-carol": 7}

    await db.set_deletion_version(first.id, 1)
    await db.erase_message(first, MemberWords(), at(2))
    assert (await store.being_erased()).interactions == frozenset()


async def test_a_topic_only_messages_being_deleted_produced_is_each_ones_own(
    db: Database,
) -> None:
    """A purge: two messages made `remote_work` and nobody else did. While both are
    being deleted, each one's words hold it (else neither erase would redact it); a
    message that stays keeps it from both."""
    await db.community(CID).commit(StateCommit(state=state(0), cause="seed", change="seed"))
    for n in (1, 2):
        await learn(
            db, answered(f"i{n}", n, ref=f"discord:{n}"), n, f"Ada's point {n}.", "remote_work"
        )
    assert (await db.message_words(CID, "i1")).topics == ()  # i2 made it too
    await db.begin_deletion(CID, "discord:1", "deleted", at(3))
    assert (await db.message_words(CID, "i1")).topics == ()  # i2 stays: still shared
    await db.begin_deletion(CID, "discord:2", "deleted", at(3))
    assert (await db.message_words(CID, "i1")).topics == ("remote_work",)
    assert (await db.message_words(CID, "i2")).topics == ("remote_work",)

    await learn(db, answered("i3", 4, ref="discord:3"), 3, "Bo's point.", "remote_work")
    assert (await db.message_words(CID, "i1")).topics == ()  # i3 stays and made it
