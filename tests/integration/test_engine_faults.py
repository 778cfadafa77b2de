"""Engine faults that cost money or evidence, each driven through the real runtime.

Each test here failed on the code before its fix:
* a rejected (or failed) reflection made the idle job reflect again every minute;
* an ESS call that failed after the SDK's retries became "no argument" for good;
* learning that failed was retried only at the next start, after later messages;
* a reflection could store an entity the model echoed, to be escaped again next time;
* a rollback, even `rollback 0`, left every later memory shaping the prompts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from bot.messages import IncomingMessage
from bot.scheduler import ReflectionScheduler
from tests.fakes.anthropic_server import Fault, Text
from tests.integration.conftest import (
    ALICE,
    BOB,
    A,
    chat_requests,
    command,
    eventually,
    prompt_of,
    say,
)
from tests.integration.test_isolation_and_commands import CANARY, teach_canary

TUTORING = dict(
    contains="randomised trial",
    score=0.7,
    direction="supports",
    topics=["tutoring"],
    novelty=0.8,
    reasoning_type="empirical_data",
)
TRIAL = "A randomised trial of 2,000 pupils showed tutoring lifts maths scores."


def reflection_requests(server: Any) -> list[Any]:
    return [r for r in server.requests if "current_self_description" in r.user_text]


async def test_a_rejected_reflection_is_not_paid_for_again_every_minute(runtime, llm_server):
    llm_server.brain.ess_rule(**TUTORING)
    # The model answers the reflection prompt with a rewrite far too short to accept.
    llm_server.brain.reply_rule(contains="It is time to reflect", text="I like maths.")
    await say(runtime, TRIAL)
    agent = runtime.registry.get(A.id)
    assert agent.sponge.pending_insights
    last = runtime.last_message_at[A.id]
    scheduler = ReflectionScheduler(runtime, clock=lambda: last)
    versions = agent.sponge.version

    assert await scheduler.run_idle(last + timedelta(minutes=31)) == [A.id]
    [event] = await runtime.db.community(A.id).audit_events(kind="reflection")
    assert event.payload["ran"] and not event.payload["accepted"]
    assert agent.sponge.pending_insights == []
    for minute in range(32, 40):
        assert await scheduler.run_idle(last + timedelta(minutes=minute)) == []
    assert len(reflection_requests(llm_server)) == 1
    assert agent.sponge.version == versions + 1


async def test_a_failed_idle_reflection_waits_for_new_conversation(runtime, llm_server):
    llm_server.brain.ess_rule(**TUTORING)
    await say(runtime, TRIAL)
    last = runtime.last_message_at[A.id]
    scheduler = ReflectionScheduler(runtime, clock=lambda: last)
    # Every try of the SDK (the first and both retries) fails.
    llm_server.enqueue(*[Fault(500, retry_after_ms=1)] * 3)
    assert await scheduler.run_idle(last + timedelta(minutes=31)) == [A.id]
    assert runtime.registry.get(A.id).sponge.pending_insights, "nothing was consumed"
    tried = len(llm_server.requests)
    for minute in range(32, 40):
        await scheduler.run_idle(last + timedelta(minutes=minute))
    assert len(llm_server.requests) == tried

    await say(runtime, "thanks!")
    again = runtime.last_message_at[A.id] + timedelta(minutes=31)
    assert await scheduler.run_idle(again) == [A.id]
    assert runtime.registry.get(A.id).sponge.pending_insights == []


async def test_evidence_scored_during_an_outage_is_kept_and_learned_in_order(runtime, llm_server):
    llm_server.brain.ess_rule(**TUTORING)
    # Alice's reply succeeds, then her ESS call fails on every SDK try.
    llm_server.enqueue(Text("Interesting, tell me more."), *[Fault(500, retry_after_ms=1)] * 3)
    first = await runtime.handle(
        IncomingMessage(community=A, channel_id="c1", user=ALICE, text=TRIAL)
    )
    assert first is not None and first.text == "Interesting, tell me more."
    agent = runtime.registry.get(A.id)
    assert await eventually(lambda: agent.learning_held, 5)
    # Bob talks while Alice's learning waits: his must not be learned before hers.
    await runtime.handle(IncomingMessage(community=A, channel_id="c1", user=BOB, text="hi all"))
    assert agent.sponge.interaction_count == 0

    agent.resume_learning()
    assert await eventually(lambda: agent.backlog == 0 and agent.sponge.interaction_count == 2, 10)
    events = await runtime.db.community(A.id).audit_events(kind="ess")
    by_interaction = sorted(events, key=lambda e: e.interaction)
    assert [e.payload["speaker"] for e in by_interaction] == [ALICE.id, BOB.id]
    alice = by_interaction[0].payload
    assert alice["score"] == TUTORING["score"] and not alice["used_defaults"]
    assert alice["staged"], "the argument staged its opinion move"


async def test_drain_returns_while_learning_waits_for_the_model(runtime, llm_server):
    """Callers that drain (the terminal's status line, commands) must not hang on an outage."""
    llm_server.enqueue(Text("ok"), *[Fault(500, retry_after_ms=1)] * 3)
    await say(runtime, "hello")
    agent = runtime.registry.get(A.id)
    assert agent.learning_held and agent.backlog == 1


async def test_escaped_text_never_accumulates_in_the_narrative(runtime, llm_server):
    """The reflection prompt shows the narrative escaped; a model that echoes an entity
    must not leave `&amp;` in the stored narrative, to be escaped again next time."""
    agent = runtime.registry.get(A.id) or await runtime.registry.agent_for(A)
    narrative = agent.sponge.snapshot + " I enjoy R&D talk & <b>bold</b> claims."
    agent.sponge = agent.sponge.model_copy(update={"snapshot": narrative})
    echoed = narrative.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    llm_server.brain.reply_rule(contains="It is time to reflect", text=echoed)
    for _ in range(2):
        await agent.reflect_now("moderator")
        assert agent.sponge.snapshot == narrative
    prompt = [r for r in llm_server.requests if "current_self_description" in r.user_text][-1]
    assert "R&amp;D talk &amp; &lt;b&gt;" in prompt.user_text  # escaped once, not twice


async def test_rollback_puts_later_memories_out_of_reach_and_undo_brings_them_back(
    runtime, llm_server
):
    """`rollback 0` is a real reset: the argument's episode and the insights drawn from
    it stop shaping prompts. Undoing the rollback restores what that version recalled."""
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)
    agent = runtime.registry.get(A.id)
    await agent.reflect_now("moderator")  # the canary insight becomes a semantic memory
    before = agent.sponge.version
    question = "What do you think about zebra crossings and road safety?"

    async def recalled() -> str:
        await say(runtime, question, user=BOB)
        return prompt_of(chat_requests(llm_server)[-1])

    assert "road-safety audit" in await recalled()
    reset = await command(runtime, "rollback", "0")
    assert reset.ok, reset.text
    prompt = await recalled()
    assert "road-safety audit" not in prompt and "<relevant_memories>" not in prompt
    reflection = [r for r in llm_server.requests if "current_self_description" in r.user_text]
    await agent.reflect_now("moderator")
    latest = [r for r in llm_server.requests if "current_self_description" in r.user_text]
    assert len(latest) == len(reflection) + 1 and "road-safety" not in latest[-1].user_text

    undo = await command(runtime, "rollback", str(before))
    assert undo.ok, undo.text
    assert "road-safety audit" in await recalled()
