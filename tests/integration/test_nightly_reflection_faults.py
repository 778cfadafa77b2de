"""The nightly reflection when something is wrong with one community.

Each test here failed on the code before its fix:
* a community the bot was removed from (in its grace period before erasure) was loaded
  again and reflected every night, paying the model for nobody;
* a reflection the model failed was marked done, so the next night skipped the
  community and its insights waited until someone talked there again;
* an error before one community's reflection (its spending check) ended the whole run,
  so the communities after it were not reflected that night.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.runtime import Runtime
from bot.scheduler import ReflectionScheduler
from tests.fakes.anthropic_server import Fault
from tests.integration.conftest import A, B, say
from tests.stack import on_every_stack

TUTORING = dict(
    contains="randomised trial",
    score=0.7,
    direction="supports",
    topics=["tutoring"],
    novelty=0.8,
)
TRIAL = "A randomised trial showed tutoring lifts maths scores."


def reflection_requests(server: Any) -> list[Any]:
    return [r for r in server.requests if "current_self_description" in r.user_text]


def later(**delta: float) -> datetime:
    return datetime.now(UTC) + timedelta(**delta)


@on_every_stack
async def test_nightly_leaves_a_removed_community_alone(
    runtime: Runtime, anthropic_server: Any
) -> None:
    await say(runtime, "hello alpha", community=A)
    await say(runtime, "hello beta", community=B)
    await runtime.removals.removed(A.id, "kicked")
    scheduler = ReflectionScheduler(runtime)

    assert await scheduler.run_nightly(later(hours=1)) == [B.id]
    assert len(reflection_requests(anthropic_server)) == 1  # B's only
    assert runtime.registry.get(A.id) is None, "the removed community was loaded again"
    assert await runtime.db.community(A.id).audit_events(kind="reflection") == []


@on_every_stack
async def test_nightly_skips_a_removal_another_process_recorded(
    runtime: Runtime, anthropic_server: Any
) -> None:
    """With several processes only one hears of the removal; the database knows."""
    await say(runtime, "hello alpha", community=A)
    await runtime.registry.unload(A.id)
    await runtime.db.mark_removed(A.id, datetime.now(UTC), timedelta(days=30))
    assert not runtime.removals.is_removed(A.id)  # this process did not hear of it

    assert await runtime.db.communities_needing_nightly() == []
    assert await ReflectionScheduler(runtime).run_nightly(later(hours=1)) == []
    assert reflection_requests(anthropic_server) == []
    assert runtime.registry.get(A.id) is None


async def test_a_failed_nightly_reflection_is_tried_again_the_next_night(
    runtime: Runtime, anthropic_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    anthropic_server.brain.ess_rule(**TUTORING)
    await say(runtime, TRIAL, community=A)
    await say(runtime, "hello beta", community=B)
    agent = runtime.registry.get(A.id)
    assert agent is not None and agent.sponge.pending_insights
    scheduler = ReflectionScheduler(runtime)

    # A (first in order) fails on every try of the SDK; B's reflection succeeds.
    anthropic_server.enqueue(*[Fault(529, retry_after_ms=1)] * 3)
    with caplog.at_level(logging.INFO, logger="bot.scheduler"):
        assert await scheduler.run_nightly(later(hours=1)) == [B.id]
    assert "nightly reflection: 1 of 2 community(ies) reflected" in caplog.text
    assert "nightly reflection: 1 community(ies) failed" in caplog.text
    assert await runtime.db.communities_needing_nightly() == [A.id]
    info = await runtime.db.community_info(A.id)
    assert info is not None and info.last_reflection_time is None

    assert await scheduler.run_nightly(later(days=1)) == [A.id]
    agent = runtime.registry.get(A.id)
    assert agent is not None and agent.sponge.pending_insights == []
    [event] = await runtime.db.community(A.id).audit_events(kind="reflection")
    assert event.payload["ran"]
    assert await runtime.db.communities_needing_nightly() == []


async def test_one_communitys_error_does_not_end_the_nightly_run(
    runtime: Runtime, anthropic_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await say(runtime, "hello alpha", community=A)
    await say(runtime, "hello beta", community=B)
    exhausted = runtime.budget.exhausted

    async def broken_for_a(community_id: str) -> bool:
        if community_id == A.id:
            raise RuntimeError("database gone for a moment")
        return await exhausted(community_id)

    monkeypatch.setattr(runtime.budget, "exhausted", broken_for_a)
    scheduler = ReflectionScheduler(runtime)
    assert await scheduler.run_nightly(later(hours=1)) == [B.id]
    assert await runtime.db.communities_needing_nightly() == [A.id]  # tried next night
    assert scheduler._running == set()

    monkeypatch.setattr(runtime.budget, "exhausted", exhausted)
    assert await scheduler.run_nightly(later(days=1)) == [A.id]


async def test_one_communitys_error_does_not_end_the_idle_run(
    runtime: Runtime, anthropic_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    anthropic_server.brain.ess_rule(**TUTORING)
    await say(runtime, TRIAL, community=A)
    await say(runtime, TRIAL, community=B)
    alpha, beta = runtime.registry.get(A.id), runtime.registry.get(B.id)
    assert alpha is not None and beta is not None
    assert alpha.sponge.pending_insights and beta.sponge.pending_insights

    async def broken() -> None:
        raise RuntimeError("database gone for a moment")

    monkeypatch.setattr(alpha, "catch_up", broken)
    quiet = max(runtime.last_message_at[A.id], runtime.last_message_at[B.id])
    scheduler = ReflectionScheduler(runtime)
    assert await scheduler.run_idle(quiet + timedelta(minutes=31)) == [B.id]
    assert beta.sponge.pending_insights == []
