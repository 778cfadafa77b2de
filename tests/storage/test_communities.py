"""Community bookkeeping for the scheduler, usage totals and moderator actions."""

from __future__ import annotations

from sonality.llm import Usage
from sonality.store import UsageRecord
from storage import Database

from .conftest import at, commit_of, record


async def test_touch_creates_and_renames(db: Database) -> None:
    await db.touch_community("discord:1", "Old name", at(0))
    await db.touch_community("discord:1", "", at(1))  # empty name keeps the old one
    info = await db.community_info("discord:1")
    assert info is not None
    assert (info.platform, info.name, info.last_activity_at) == ("discord", "Old name", at(1))
    await db.touch_community("discord:1", "New name", at(2))
    info = await db.community_info("discord:1")
    assert info is not None and info.name == "New name"
    assert await db.community_info("discord:404") is None


async def test_activity_never_moves_backwards(db: Database) -> None:
    await db.touch_community("discord:1", "", at(10))
    await db.touch_community("discord:1", "", at(5))
    info = await db.community_info("discord:1")
    assert info is not None and info.last_activity_at == at(10)


async def test_community_ids_sorted(db: Database) -> None:
    for cid in ("slack:T1", "discord:9", "terminal:local"):
        await db.touch_community(cid, "", at(0))
    assert await db.community_ids() == ["discord:9", "slack:T1", "terminal:local"]


async def test_nightly_selection(db: Database) -> None:
    await db.touch_community("discord:never-reflected", "", at(0))
    await db.touch_community("discord:active-since", "", at(0))
    await db.mark_reflected("discord:active-since", at(10))
    await db.touch_community("discord:active-since", "", at(20))
    await db.touch_community("discord:quiet", "", at(0))
    await db.mark_reflected("discord:quiet", at(10))
    await db.mark_reflected("discord:no-activity", at(10))

    assert await db.communities_needing_nightly() == [
        "discord:active-since",
        "discord:never-reflected",
    ]
    await db.mark_reflected("discord:active-since", at(60))
    await db.mark_reflected("discord:never-reflected", at(60))
    assert await db.communities_needing_nightly() == []


async def test_own_commits_are_not_activity_but_interactions_are(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0, cause="seed"))
    assert await db.communities_needing_nightly() == []
    await store.record_interaction(record("i1", minutes=1))
    assert await db.communities_needing_nightly() == ["discord:1"]
    await db.mark_reflected("discord:1", at(2))
    # The reflection's own commit must not make the community look active again.
    await store.commit(commit_of(1, cause="reflection"))
    await store.commit(commit_of(2, cause="decay"))
    info = await db.community_info("discord:1")
    assert info is not None and info.last_activity_at == at(1)
    assert await db.communities_needing_nightly() == []


async def test_learning_committed_after_a_reflection_is_not_new_activity(db: Database) -> None:
    """The nightly job drains queued learning before reflecting; that is not activity."""
    store = db.community("discord:1")
    await store.commit(commit_of(0, cause="seed"))
    await store.record_interaction(record("i1", minutes=1))
    await db.mark_reflected("discord:1", at(2))
    await store.commit(commit_of(1, interaction_id="i1"))  # committed after at(2)
    assert await db.communities_needing_nightly() == []


async def test_usage_totals_sum_overall_and_per_role(db: Database) -> None:
    usage = [
        UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=3, output_tokens=1)),
        UsageRecord(purpose="ess", model="m", usage=Usage(input_tokens=4, cache_write_tokens=9)),
        UsageRecord(purpose="reflection", model="m", usage=Usage(output_tokens=7)),
    ]
    await db.community("discord:1").commit(commit_of(0, usage=usage))
    totals = await db.usage_totals("discord:1")
    assert totals.calls == 3
    assert totals.usage == Usage(
        input_tokens=7, output_tokens=8, cache_read_tokens=0, cache_write_tokens=9
    )
    assert totals.by_role["evidence"].input_tokens == 7
    assert totals.by_role["reflection"].output_tokens == 7
    empty = await db.usage_totals("discord:none")
    assert (empty.calls, empty.usage) == (0, Usage())


async def test_moderator_actions_newest_first_including_refusals(db: Database) -> None:
    await db.record_moderator_action(
        "discord:1",
        actor_id="u1",
        actor_name="Mod",
        action="rollback",
        allowed=True,
        args="3 spam",
        reason="spam wave",
        at=at(0),
    )
    await db.record_moderator_action(
        "discord:1",
        actor_id="u2",
        actor_name="Troll",
        action="reflect",
        allowed=False,
        args="now",
        reason="refused: not a moderator",
        at=at(1),
    )
    actions = await db.moderator_actions("discord:1")
    assert [(a.actor_id, a.action, a.allowed, a.args) for a in actions] == [
        ("u2", "reflect", False, "now"),
        ("u1", "rollback", True, "3 spam"),
    ]
    assert actions[1].reason == "spam wave" and actions[1].created_at == at(0)
    assert len(await db.moderator_actions("discord:1", limit=1)) == 1
