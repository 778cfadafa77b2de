"""A forget-me or message deletion left open: its process died and was not started
again (several processes), or it failed and the member saw an error. Until a process
starts, replies would still recall what it was to erase; housekeeping finishes one
begun `ABANDONED_AFTER` ago, and leaves one under way alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.messages import IncomingMessage
from bot.runtime import Runtime
from bot.scheduler import ABANDONED_AFTER, ReflectionScheduler
from tests.integration.conftest import ALICE, BOB, A, say


async def test_housekeeping_finishes_a_forget_me_and_a_deletion_left_open(
    runtime: Runtime,
) -> None:
    await say(runtime, "Alice's argument about rent control.")
    await say(runtime, "Bob says hello.", user=BOB)
    said = IncomingMessage(
        community=A, channel_id="c1", user=BOB, text="Bob's second word.", message_id="b2"
    )
    assert await runtime.handle(said) is not None
    await runtime.drain()
    now = datetime.now(UTC)
    long_ago = now - ABANDONED_AFTER - timedelta(minutes=1)
    forget = await runtime.db.begin_forget(A.id, ALICE.id, "self", "", long_ago)
    [deletion] = await runtime.db.begin_deletion(A.id, "test:b2", "deleted", long_ago)
    scheduler = ReflectionScheduler(runtime, clock=lambda: now)

    await scheduler.finish_abandoned_erasures(now - ABANDONED_AFTER - timedelta(minutes=2))
    assert [r.id for r in await runtime.db.open_forgets()] == [forget.id]  # not yet
    assert [d.id for d in await runtime.db.open_deletions()] == [deletion.id]

    await scheduler.run_housekeeping(now)
    assert await runtime.db.open_forgets() == []
    assert await runtime.db.open_deletions() == []
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []
    assert await runtime.db.kept_messages("test:b2") == []
    assert len(await runtime.db.member_interaction_ids(A.id, BOB.id)) == 1
