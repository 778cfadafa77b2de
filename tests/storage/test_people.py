"""`PeopleStore`: the names members spoke under and the arguments that staged updates,
read per community, as stored (the timeline credits moves with them)."""

from __future__ import annotations

from sonality.store import AuditEvent, InteractionRecord, Speaker
from storage import Database
from tests.storage.conftest import commit_of


def said(interaction_id: str, speaker_id: str, name: str) -> InteractionRecord:
    return InteractionRecord(
        id=interaction_id, speaker=Speaker(id=speaker_id, name=name), message="m", reply="r"
    )


async def test_names_are_the_latest_stored_per_community(db: Database) -> None:
    store = db.community("test:a")
    await store.record_interaction(said("i1", "u1", "Maria"))
    await store.record_interaction(said("i2", "u1", "Maria K."))  # renamed since
    await store.record_interaction(said("i3", "u2", ""))  # no name recorded
    await db.community("test:b").record_interaction(said("i4", "u3", "Elsewhere"))

    names = await db.speaker_names("test:a", ["u1", "u2", "u3", "u-never"])
    assert names == {"u1": "Maria K."}
    assert await db.speaker_names("test:b", ["u1", "u3"]) == {"u3": "Elsewhere"}
    assert await db.speaker_names("test:a", []) == {}


async def test_staged_arguments_keep_only_events_that_staged(db: Database) -> None:
    store = db.community("test:a")

    def ess(interaction: int, speaker: str, staged: object) -> AuditEvent:
        return AuditEvent(
            kind="ess", interaction=interaction, payload={"speaker": speaker, "staged": staged}
        )

    await store.commit(commit_of(0, cause="seed"))
    await store.commit(
        commit_of(1, events=[ess(1, "u1", [{"topic": "t", "delta": 0.02, "due": 4}])])
    )
    await store.commit(commit_of(2, events=[ess(2, "u2", [])]))  # chat: nothing staged
    bad = [{"topic": "t"}, {"topic": "u", "delta": -0.01, "due": 6}]
    await store.commit(commit_of(3, events=[ess(3, "u2", bad)]))  # one malformed entry
    await db.community("test:b").commit(commit_of(0, cause="seed"))

    found = await db.staged_arguments("test:a")
    assert [(a.version, a.interaction, a.speaker) for a in found] == [(1, 1, "u1"), (3, 3, "u2")]
    assert [(e.topic, e.delta, e.due) for e in found[1].staged] == [("u", -0.01, 6)]
    assert [a.version for a in await db.staged_arguments("test:a", up_to_version=2)] == [1]
    assert await db.staged_arguments("test:b") == []
