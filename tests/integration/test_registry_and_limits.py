"""Idle communities are unloaded (and reload intact); floods cost no LLM calls."""

from __future__ import annotations

import asyncio

from bot.messages import IncomingMessage
from bot.ratelimit import RateLimiter, Verdict
from bot.registry import CommunityRegistry
from tests.integration.conftest import ALICE, A, B, say


async def test_idle_agents_are_evicted_and_reload_with_their_state(runtime, anthropic_server):
    anthropic_server.brain.ess_rule(
        contains="cohort study", score=0.7, direction="supports", topics=["cycling"]
    )
    now = [0.0]
    registry = CommunityRegistry(runtime.registry.factory, idle_seconds=60, clock=lambda: now[0])
    runtime.registry = registry
    await say(runtime, "A cohort study shows protected lanes cut cycling injuries.", community=A)
    await say(runtime, "hi", community=B)
    a_before = registry.get(A.id)
    assert a_before is not None and a_before.sponge.staged_opinion_updates

    assert a_before.sponge.pending_insights  # A has something to reflect on
    now[0] = 50.0
    assert await registry.evict_idle() == []
    await say(runtime, "still here", community=B)  # B was used at t=50
    now[0] = 100.0  # A idle 100 s, but gets twice the idle time to reflect first; B 50 s
    assert await registry.evict_idle() == []
    now[0] = 115.0  # B idle 65 s > 60 s
    assert await registry.evict_idle() == [B.id]
    assert registry.get(A.id) is a_before
    now[0] = 125.0  # A idle 125 s > 2 x 60 s
    assert await registry.evict_idle() == [A.id]
    assert registry.get(A.id) is None

    reloaded = await registry.agent_for(A)
    assert reloaded is not a_before
    assert reloaded.sponge.version == a_before.sponge.version
    assert reloaded.sponge.staged_opinion_updates == a_before.sponge.staged_opinion_updates
    assert reloaded.episodes.count() == 1
    await registry.close_all()


async def test_one_load_for_simultaneous_first_messages(runtime):
    agents = await asyncio.gather(*(runtime.registry.agent_for(A) for _ in range(5)))
    assert len({id(a) for a in agents}) == 1


def test_rate_limiter_warns_once_then_drops_then_recovers():
    now = [0.0]
    limiter = RateLimiter(limit=2, window=10.0, clock=lambda: now[0])
    assert limiter.check("c", "u") is Verdict.ALLOW
    assert limiter.check("c", "u") is Verdict.ALLOW
    assert limiter.check("c", "u") is Verdict.WARN
    assert limiter.check("c", "u") is Verdict.DROP
    assert limiter.check("c", "other") is Verdict.ALLOW  # per user
    assert limiter.check("other", "u") is Verdict.ALLOW  # per community
    now[0] = 10.5
    assert limiter.check("c", "u") is Verdict.ALLOW
    now[0] = 100.0
    limiter.forget_idle()
    assert limiter._hits == {} and limiter._warned == {}  # memory stays bounded


async def test_a_message_during_an_unload_gets_an_agent_with_the_unloaded_ones_learning(
    runtime, anthropic_server
):
    """An unload finishes the old agent's queued learning. A message arriving meanwhile
    must wait for it: an agent loaded from the state before that commit would answer
    from stale state and, on SQLite, write its next version over the learned one."""
    anthropic_server.brain.ess_rule(
        contains="cohort study", score=0.7, direction="supports", topics=["cycling"]
    )
    await say(runtime, "hello", community=A)  # loaded, one learned message
    anthropic_server.latency = 0.3  # the next message's learning is still running below
    await runtime.handle(
        IncomingMessage(
            community=A,
            channel_id="c1",
            user=ALICE,
            text="A cohort study shows protected lanes cut cycling injuries.",
        )
    )
    old = runtime.registry.get(A.id)
    assert old is not None and old.backlog  # learning queued or in flight
    unloading = asyncio.create_task(runtime.registry.unload(A.id))
    await asyncio.sleep(0.05)  # the unload has taken the agent out and is closing it
    assert runtime.registry.get(A.id) is None
    anthropic_server.latency = 0.0
    new = await runtime.registry.agent_for(A)
    assert await unloading
    assert new is not old
    stored = await runtime.db.community(A.id).latest_state()
    assert stored is not None and stored.interaction_count == 2  # both messages learned
    assert new.sponge.version == await runtime.db.community(A.id).latest_version()
    assert new.sponge.interaction_count == 2
    assert new.sponge.staged_opinion_updates == stored.staged_opinion_updates != []
