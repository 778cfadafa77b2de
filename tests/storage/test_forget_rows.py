"""Forget-me's storage side on both engines: the member's rows go, their id and words
are redacted from what stays, and the redaction gate on past versions closes again.

(Replaying the opinions and Chroma are the bot's part: tests/integration/test_forget_*.)
"""

from __future__ import annotations

import pytest

from sonality.store import AuditEvent, InteractionRecord, Speaker, StateCommit
from storage import Database

from .conftest import Backend, at, state

CID = "slack:T1"
MEMBER = "U0ZEDMEMBER"
WORD = "zebraquokka"


def rows_holding(backend: Backend, needle: str) -> list[str]:
    if backend.postgres:
        query = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    else:
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    found = []
    for (table,) in backend.sql(query):
        for row in backend.sql(f'SELECT * FROM "{table}"'):
            if any(needle in str(value) for value in row):
                found.append(f"{table}: {row}")
    return found


async def test_a_forgotten_member_leaves_no_id_or_words_and_the_gate_closes(
    db: Database, backend: Backend
) -> None:
    store = db.community(CID)
    await store.commit(StateCommit(state=state(0), cause="seed", change="seed"))
    await store.record_interaction(
        InteractionRecord(
            id="i1",
            speaker=Speaker(id=MEMBER, name="Zed"),
            message=f"{WORD} is my argument",
            reply="noted",
            created_at=at(1),
            model="m",
        )
    )
    summary = f"Zed argues {WORD} matters."
    await store.commit(
        StateCommit(
            state=state(1),
            cause="interaction",
            change=f"after {MEMBER}'s argument",
            actor=MEMBER,
            interaction_id="i1",
            events=[
                AuditEvent(
                    kind="ess", interaction=1, payload={"speaker": MEMBER, "summary": summary}
                ),
                AuditEvent(kind="note", interaction=1, payload={"about": MEMBER}),
            ],
        )
    )
    await db.append_exchange(CID, MEMBER, f"{WORD}?", "yes", at(2))
    await db.record_moderator_action(
        CID, actor_id=MEMBER, actor_name="Zed", action="reflect", allowed=True
    )
    assert rows_holding(backend, MEMBER) and rows_holding(backend, WORD)

    request = await db.begin_forget(CID, MEMBER, requested_by="mod", reason="", at=at(3))
    assert (await db.begin_forget(CID, MEMBER, "mod", "", at(4))).id == request.id  # resumes
    words = await db.member_words(CID, MEMBER)
    assert summary in words.texts
    assert await db.forgets_after(CID, 1)  # under way: a rollback now must re-apply it
    assert await db.erase_member(request, words, at(5)) > 0

    assert rows_holding(backend, MEMBER) == []
    assert rows_holding(backend, WORD) == []
    versions = await store.versions()
    assert [(v.version, v.cause) for v in versions] == [(1, "interaction"), (0, "seed")]
    assert versions[0].actor == request.pseudonym
    assert request.pseudonym in versions[0].change
    assert await db.open_forgets() == []
    assert not await db.forgets_after(CID, 0)  # finished, without a version of its own
    # The gate was open only inside erase_member's transaction.
    with pytest.raises(backend.integrity_error, match="append-only"):
        backend.run("UPDATE personality_versions SET change = 'edited' WHERE version = 1")


async def test_forgets_after_counts_one_under_way_and_those_finished_later(db: Database) -> None:
    """What a rollback to a version must re-apply (`reapply_after_rollback`): a forget-me
    under way, whatever its version (its replay may be committed, its erase not yet
    done), and finished ones whose version is newer; none of another community."""
    await db.community(CID).commit(StateCommit(state=state(0), cause="seed", change="seed"))
    assert not await db.forgets_after(CID, 0)
    request = await db.begin_forget(CID, MEMBER, requested_by="self", reason="", at=at(1))
    assert await db.forgets_after(CID, 9)  # under way, no version yet
    await db.set_forget_version(request.id, 5)
    assert await db.forgets_after(CID, 9)  # under way, replay committed
    await db.begin_forget("slack:T2", "U0OTHER", requested_by="self", reason="", at=at(1))
    await db.erase_member(request, await db.member_words(CID, MEMBER), at(2))
    assert await db.forgets_after(CID, 4)
    assert not await db.forgets_after(CID, 5)  # T2's open request is T2's alone
