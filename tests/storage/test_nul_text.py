"""A NUL character from a model's text must not fail a write on either engine."""

from __future__ import annotations

from sonality.store import AuditEvent
from storage import Database
from storage.base import NUL_STAND_IN

from .conftest import Backend, commit_of, record


async def test_a_nul_in_a_reply_and_a_payload_is_stored_and_read_back(
    backend: Backend, db: Database
) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    rec = record("a", "hello")
    rec = rec.model_copy(update={"reply": "before\x00after"})
    await store.record_interaction(rec)
    payload = {"speaker": "u1", "summary": "half\x00way"}
    await store.commit(
        commit_of(
            1, interaction_id="a", events=[AuditEvent(kind="ess", interaction=1, payload=payload)]
        )
    )

    stand_in = "\x00" if backend.name == "sqlite" else NUL_STAND_IN
    rows = await db.member_rows("discord:1", "u1")
    assert [m.reply for m in rows.messages] == [f"before{stand_in}after"]
    # The member's ratings are found by a JSON query over the payload column: on
    # PostgreSQL a stored NUL escape would make that cast fail for every row.
    assert [r.payload["summary"] for r in rows.ratings] == [f"half{stand_in}way"]
