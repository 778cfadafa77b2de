"""Forget-me's storage side by exact keys, on both engines (issue 22, findings 1, 5, 6).

Finding 5: ids are prefixes of one another ("terminal-bob", "terminal-bobby") and a
one-letter id occurs in any text, so a forget that selects or replaces by substring
rewrites other members' rows and breaks JSON. Finding 1: a reply in flight while its
member confirms forget-me must not be recorded when it lands, even after the forget-me
finished (the journal keeps a salted key, not the id). Finding 6: a database restored
from before a forget-me gets it journaled again from the key.
"""

from __future__ import annotations

import json

from sonality.state import BeliefMeta, MoveSource, SpongeState, StagedOpinionUpdate
from sonality.store import AuditEvent, InteractionRecord, Speaker, StateCommit
from storage import Database
from storage.forget import JournalEntry
from storage.forgotten import forget_key

from .conftest import Backend, at

CID = "terminal"
BOB = Speaker(id="terminal-bob", name="Bob")
BOBBY = Speaker(id="terminal-bobby", name="Bobby")


def said(speaker: Speaker, n: int, minutes: float = 1) -> InteractionRecord:
    return InteractionRecord(
        id=f"{speaker.id}-{n}",
        speaker=speaker,
        message=f"{speaker.name} says thing {n}",
        reply="noted",
        created_at=at(minutes),
        model="m",
    )


def both_argued() -> SpongeState:
    """A state whose belief and staged updates name both members."""
    state = SpongeState(version=1, interaction_count=2)
    state.opinion_vectors["tea"] = 0.2
    state.belief_meta["tea"] = BeliefMeta(
        moved_by=[MoveSource(member=BOBBY.id, delta=0.1), MoveSource(member=BOB.id, delta=0.1)]
    )
    state.staged_opinion_updates = [
        StagedOpinionUpdate(
            topic="tea", signed_magnitude=0.1, staged_at=1, due_interaction=4, member=m.id
        )
        for m in (BOB, BOBBY)
    ]
    return state


async def fill(db: Database) -> None:
    store = db.community(CID)
    await store.commit(StateCommit(state=SpongeState(), cause="seed", change="seed"))
    for n, who in enumerate((BOB, BOBBY)):
        await store.record_interaction(said(who, n))
        await db.append_exchange(CID, who.id, f"{who.name} asks", "answer", at(1))
    await store.commit(
        StateCommit(
            state=both_argued(),
            cause="interaction",
            change=f"after {BOBBY.id} spoke, e.g. twice",
            actor=f"Bobby ({BOBBY.id})",
            interaction_id=f"{BOB.id}-0",
            events=[
                AuditEvent(kind="ess", interaction=1, payload={"speaker": BOBBY.id, "n": 1}),
                AuditEvent(kind="ess", interaction=1, payload={"speaker": BOB.id, "n": 2}),
                AuditEvent(
                    kind="note",
                    interaction=1,
                    payload={"about": BOBBY.id, "text": f"{BOB.id} and {BOBBY.id}, e.g."},
                ),
            ],
        )
    )
    await db.record_moderator_action(
        CID, actor_id=BOBBY.id, actor_name="Bobby", action="reflect", allowed=True
    )


def audit(backend: Backend) -> list[tuple[str, str]]:
    return [(str(k), str(p)) for k, p in backend.sql("SELECT kind, payload_json FROM audit_events")]


async def forget(db: Database, member: str) -> str:
    request = await db.begin_forget(CID, member, "mod", "", at(5))
    await db.erase_member(request, await db.member_words(CID, member), at(6))
    return request.pseudonym


async def test_forgetting_bob_leaves_bobby_and_every_json_whole(
    db: Database, backend: Backend
) -> None:
    await fill(db)
    store = db.community(CID)
    bobby_rows = await db.member_rows(CID, BOBBY.id)

    pseudonym = await forget(db, BOB.id)

    assert await db.member_rows(CID, BOBBY.id) == bobby_rows
    assert await db.member_interaction_ids(CID, BOB.id) == []
    [_, argued] = sorted(await store.versions(), key=lambda v: v.version)
    assert (argued.actor, argued.change) == (
        f"Bobby ({BOBBY.id})",
        f"after {BOBBY.id} spoke, e.g. twice",
    )
    old = await store.state_at(1)
    assert old is not None
    assert [m.member for m in old.belief_meta["tea"].moved_by] == [BOBBY.id, pseudonym]
    assert [u.member for u in old.staged_opinion_updates] == [pseudonym, BOBBY.id]
    events = {kind: json.loads(payload) for kind, payload in audit(backend) if kind == "note"}
    assert events["note"] == {"about": BOBBY.id, "text": f"{pseudonym} and {BOBBY.id}, e.g."}
    assert [json.loads(p)["speaker"] for k, p in audit(backend) if k == "ess"] == [BOBBY.id]

    # A one-letter "member" changes nothing and breaks no JSON.
    before = (
        audit(backend),
        backend.sql("SELECT state_json, change, actor FROM personality_versions"),
    )
    await forget(db, "e")
    after = (
        audit(backend),
        backend.sql("SELECT state_json, change, actor FROM personality_versions"),
    )
    assert after == before
    assert all(json.loads(payload) for _, payload in after[0])


async def test_a_reply_in_flight_during_forget_me_is_never_recorded(db: Database) -> None:
    store = db.community(CID)
    await store.commit(StateCommit(state=SpongeState(), cause="seed", change="seed"))
    await store.record_interaction(said(BOB, 0, minutes=1))
    request = await db.begin_forget(CID, BOB.id, "self", "", at(2))
    # Asked before the forget-me, landing while it runs (and after it: below).
    during = [
        await store.record_interaction(said(BOB, 1, minutes=1.5)),
        await db.append_exchange(CID, BOB.id, "q", "a", at(2.5), asked_at=at(1.5)),
    ]
    assert await store.record_interaction(said(BOBBY, 0, minutes=1.5)) is True
    # Not learned meanwhile: the forget-me is about to delete it.
    assert [r.speaker.id for r in await store.pending_interactions()] == [BOBBY.id]
    await db.erase_member(request, await db.member_words(CID, BOB.id), at(3))
    after = [
        await store.record_interaction(said(BOB, 2, minutes=1.9)),
        await db.append_exchange(CID, BOB.id, "q", "a", at(4), asked_at=at(1.9)),
    ]

    assert await db.member_interaction_ids(CID, BOB.id) == []
    assert (await db.member_rows(CID, BOB.id)).conversation_turns == ()
    assert during == after == [False, False]
    # What Bob says after his forget-me is kept as anyone's.
    assert await store.record_interaction(said(BOB, 3, minutes=4)) is True
    assert await db.append_exchange(CID, BOB.id, "q", "a", at(4), asked_at=at(4)) is True
    assert await db.member_interaction_ids(CID, BOB.id) == [f"{BOB.id}-3"]


async def test_a_restored_database_journals_the_forget_me_it_lacks(db: Database) -> None:
    await fill(db)
    entries = [
        JournalEntry(pseudonym="member-aaaaaa", key=forget_key(CID, BOB.id), at=at(9)),
        JournalEntry(pseudonym="member-bbbbbb", key=forget_key(CID, "terminal-nobody"), at=at(9)),
    ]
    assert await db.rejournal(entries, at(10)) == ["member-aaaaaa"]
    [open_request] = await db.open_forgets()
    assert (open_request.member_id, open_request.pseudonym) == (BOB.id, "member-aaaaaa")
    assert await db.journal_pseudonyms() == {"member-aaaaaa", "member-bbbbbb"}
    assert await db.rejournal(entries, at(11)) == []  # known now


async def test_her_insight_leaves_a_version_that_does_not_name_her(
    db: Database, backend: Backend
) -> None:
    """A version holds an insight drawn from her message among the insights waiting for
    a reflection, without her id in that row; it goes all the same."""
    store = db.community(CID)
    await store.commit(StateCommit(state=SpongeState(), cause="seed", change="seed"))
    insight = "Tidal barrages pay back within a decade, per the ferret study."
    await store.record_interaction(said(BOB, 0))
    waiting = SpongeState(version=1, interaction_count=1, pending_insights=["kept", insight])
    await store.commit(
        StateCommit(
            state=waiting,
            cause="interaction",
            change="insight noted",
            interaction_id=f"{BOB.id}-0",
            events=[
                AuditEvent(
                    kind="ess", interaction=1, payload={"speaker": BOB.id, "insight": insight}
                )
            ],
        )
    )
    await forget(db, BOB.id)
    old = await store.state_at(1)
    assert old is not None and old.pending_insights == ["kept", "(forgotten)"]
    assert not [
        r for r in backend.sql("SELECT state_json FROM personality_versions") if "ferret" in str(r)
    ]


async def test_the_daily_limit_stays_and_only_its_setter_becomes_the_pseudonym(
    db: Database,
) -> None:
    """A moderator who set the community's daily limit, then ran forget-me: the limit is
    the community's and stays; their name and id in `set_by` go. Forgetting "terminal-bob"
    leaves a limit "terminal-bobby" set untouched."""
    await fill(db)
    await db.set_budget_override(CID, 2.5, set_by=f"Bobby ({BOBBY.id})")
    await forget(db, BOB.id)
    override = await db.budget_override(CID)
    assert override is not None and override.set_by == f"Bobby ({BOBBY.id})"
    pseudonym = await forget(db, BOBBY.id)
    override = await db.budget_override(CID)
    assert override is not None
    assert (override.daily_limit_usd, override.set_by) == (2.5, pseudonym)
    assert BOBBY.id not in pseudonym and "Bobby" not in pseudonym


async def test_a_limit_set_under_a_bare_id_loses_the_id(db: Database) -> None:
    await fill(db)
    await db.set_budget_override(CID, None, set_by=BOB.id)  # explicitly no limit
    pseudonym = await forget(db, BOB.id)
    override = await db.budget_override(CID)
    assert override is not None
    assert (override.daily_limit_usd, override.set_by) == (None, pseudonym)


async def test_her_own_topic_leaves_the_ratings_of_other_members_messages(
    db: Database, backend: Backend
) -> None:
    """Bob's argument made `bobtopic` a topic (only his messages produced it); its staged
    move was committed while Bobby spoke, so Bobby's rating lists it as committed. After
    Bob's forget-me the label is in no audit row, and Bobby's rating keeps the rest."""
    store = db.community(CID)
    await store.commit(StateCommit(state=SpongeState(), cause="seed", change="seed"))
    await store.commit(
        StateCommit(
            state=SpongeState(version=1, interaction_count=2),
            cause="interaction",
            change="two messages",
            events=[
                AuditEvent(
                    kind="ess",
                    interaction=1,
                    payload={"speaker": BOB.id, "topics": ["bobtopic"], "summary": "a claim"},
                ),
                AuditEvent(
                    kind="ess",
                    interaction=2,
                    payload={
                        "speaker": BOBBY.id,
                        "topics": ["tea"],
                        "summary": "tea is fine",
                        "committed": ["bobtopic", "tea"],
                    },
                ),
            ],
        )
    )
    await forget(db, BOB.id)
    rows = audit(backend)
    assert not [payload for _, payload in rows if "bobtopic" in payload], rows
    [bobby] = [json.loads(p) for kind, p in rows if kind == "ess"]
    assert bobby == {
        "speaker": BOBBY.id,
        "topics": ["tea"],
        "summary": "tea is fine",
        "committed": ["tea"],
    }
