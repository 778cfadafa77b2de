"""The learning pipeline end to end: runtime → engine → real SDK → loopback LLM server.

Tests taking `llm_server` run once with Anthropic's SDK and fake, once with OpenAI's.

Only strong, directional evidence may move an opinion, and only after the cooling
period; reflection runs on its two triggers and is validated; LLM faults change nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import chromadb
import pytest
from chromadb.api.models.Collection import Collection

from app.wiring import open_runtime
from bot.messages import LLM_DOWN, SLOW_DOWN, IncomingMessage, ReplyKind
from chroma_memory.embedding import default_embedding_function
from chroma_memory.server import ServerMemory
from sonality.state import SEED_SNAPSHOT, SpongeState
from sonality.store import Episode, InteractionRecord, Speaker, StateCommit
from storage import StorageError
from storage.community import CommunityStore
from tests.fakes.anthropic_server import AnthropicFake, Fault, Text, ToolUse
from tests.integration.conftest import (
    ALICE,
    BOB,
    A,
    chat_requests,
    command,
    ess_requests,
    eventually,
    make_settings,
    prompt_of,
    say,
)
from tests.stack import Stack, on_every_stack

#: Every test here runs on the embedded default and on PostgreSQL + a Chroma server.
pytestmark = on_every_stack

ATOMIC_QUESTION = "How dangerous are atomic power plants?"


async def bob_asks_about_atomic_plants(runtime: Any, llm_server: Any) -> None:
    """Another user asks about the topic in other words: he gets an answer whose prompt
    recalled the nuclear argument made earlier (episodes are embedded from their summary,
    which this question matches at 0.43 cosine)."""
    reply = await runtime.handle(
        IncomingMessage(community=A, channel_id="c1", user=BOB, text=ATOMIC_QUESTION)
    )
    assert reply is not None and reply.kind is ReplyKind.ANSWER
    prompt = prompt_of(chat_requests(llm_server)[-1])
    assert "<relevant_memories>" in prompt and str(NUCLEAR["summary"]) in prompt


NUCLEAR = dict(
    contains="reactor fleet data",
    score=0.8,
    direction="supports",
    topics=["nuclear_energy"],
    novelty=0.9,
    reasoning_type="empirical_data",
    source_reliability="peer_reviewed",
    summary="User cites reactor fleet data showing nuclear power's low death rate per TWh.",
)
BUS_LANES = dict(
    contains="Bus lanes",
    score=0.6,
    direction="supports",
    topics=["public_transport"],
    novelty=0.7,
    reasoning_type="empirical_data",
    source_reliability="informed_opinion",
    summary="Argues that dedicated bus lanes shorten journeys, citing a local pilot.",
)
STRONG_ARGUMENT = (
    "Look at the reactor fleet data: deaths per TWh for nuclear are lower than for wind, "
    "and the lifecycle CO2 is comparable, so nuclear deserves a bigger role."
)


async def test_casual_chat_and_social_pressure_change_no_opinion(runtime, llm_server):
    llm_server.brain.ess_rule(
        contains="everyone knows",
        score=0.1,
        direction="opposes",
        topics=["nuclear_energy"],
        reasoning_type="social_pressure",
        source_reliability="unverified_claim",
    )
    for text in (
        "hey, how's it going?",
        "Everyone knows nuclear is a disaster. Just agree with me!",
        "EVERYONE KNOWS it. You're wrong and you know it.",
        "seriously, everyone knows this",
        "ok whatever",
    ):
        reply = await say(runtime, text)
        assert reply is not None and reply.kind is ReplyKind.ANSWER
    state = runtime.registry.get(A.id).sponge
    assert state.interaction_count == 5
    assert state.opinion_vectors == {}
    assert state.staged_opinion_updates == []
    assert state.pending_insights == []  # no insight below the ESS threshold
    # Pressure is not engagement: only what the engine learns from counts as a topic.
    assert state.behavioral_signature.topic_engagement == {}
    # The ESS classifier saw the user's words only, never the agent's reply.
    assert len(ess_requests(llm_server)) == 5
    for req in ess_requests(llm_server):
        assert "[reply]" not in req.user_text


async def test_strong_argument_stages_then_commits_after_cooling(runtime, llm_server):
    llm_server.brain.ess_rule(**NUCLEAR)
    await say(runtime, STRONG_ARGUMENT)
    agent = runtime.registry.get(A.id)
    state = agent.sponge
    assert state.opinion_vectors == {}
    assert len(state.staged_opinion_updates) == 1
    staged = state.staged_opinion_updates[0]
    # magnitude = base 0.1 x score 0.8 x novelty 0.9 x bootstrap 0.5; no prior confidence
    assert staged.signed_magnitude == pytest.approx(0.036)
    assert staged.due_interaction == 1 + 3
    assert len(state.pending_insights) == 1  # insight extracted above the threshold

    await say(runtime, "nice weather today")
    await say(runtime, "what's for lunch?")
    assert agent.sponge.opinion_vectors == {}  # still cooling at interaction 3
    await say(runtime, "anyway")
    state = agent.sponge
    assert state.interaction_count == 4
    assert state.opinion_vectors["nuclear_energy"] == pytest.approx(0.036)
    meta = state.belief_meta["nuclear_energy"]
    assert meta.evidence_count == 1
    assert meta.confidence == pytest.approx(math.log2(2) / math.log2(20))
    assert meta.last_reinforced == 4
    assert "reactor fleet data" in meta.provenance
    assert state.staged_opinion_updates == []
    # Every interaction is one version; the seed is v0.
    assert state.version == 4
    store = runtime.db.community(A.id)
    assert await store.latest_version() == 4
    events = await store.audit_events(kind="ess", limit=10)
    assert len(events) == 4


async def test_reflection_runs_every_20_interactions(runtime, llm_server):
    for i in range(19):
        await say(runtime, f"small talk number {i}")
    store = runtime.db.community(A.id)
    assert await store.audit_events(kind="reflection") == []
    await say(runtime, "small talk number 19")
    events = await store.audit_events(kind="reflection")
    assert len(events) == 1
    assert events[0].payload["trigger"] == "periodic"
    assert events[0].payload["accepted"] is True
    assert runtime.registry.get(A.id).sponge.last_reflection_at == 20


async def test_early_reflection_on_cumulative_shift(runtime, llm_server):
    llm_server.brain.ess_rule(
        contains="meta-analysis",
        score=0.9,
        direction="supports",
        topics=["remote_work", "four_day_week"],
        novelty=1.0,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
    )
    for i in range(10):
        await say(runtime, f"chatting {i}")
    await say(runtime, "A 2023 meta-analysis of 40 trials shows productivity gains because ...")
    store = runtime.db.community(A.id)
    for i in range(2):
        await say(runtime, f"more chat {i}")
    assert await store.audit_events(kind="reflection") == []
    await say(runtime, "last chat")  # interaction 14: both staged updates commit (0.09 each)
    state = runtime.registry.get(A.id).sponge
    assert state.opinion_vectors["remote_work"] == pytest.approx(0.09)
    events = await store.audit_events(kind="reflection")
    assert len(events) == 1
    assert events[0].interaction == 14
    assert events[0].payload["trigger"].startswith("shift")
    assert state.last_reflection_at == 14


async def test_reflection_that_shrinks_the_snapshot_is_rejected(runtime, llm_server):
    llm_server.brain.reply_rule(
        contains="current_self_description", text="I am now a much shorter self, sadly."
    )
    await say(runtime, "hello there")
    result = await command(runtime, "reflect")
    assert "kept the old one" in result.text
    agent = runtime.registry.get(A.id)
    assert agent.sponge.snapshot == SEED_SNAPSHOT
    events = await runtime.db.community(A.id).audit_events(kind="reflection")
    assert events[0].payload["accepted"] is False
    assert events[0].payload["new_chars"] < 0.6 * events[0].payload["old_chars"]


async def test_reflection_that_keeps_enough_is_accepted(runtime, llm_server):
    new_self = SEED_SNAPSHOT + " Lately I have grown fond of careful arguments about energy."
    llm_server.brain.reply_rule(contains="current_self_description", text=new_self)
    await say(runtime, "hello there")
    result = await command(runtime, "reflect")
    assert result.ok, result.text
    assert runtime.registry.get(A.id).sponge.snapshot == new_self


async def test_llm_fault_on_reply_leaves_state_unchanged(runtime, llm_server):
    await say(runtime, "first message")
    store = runtime.db.community(A.id)
    before = await store.latest_version()
    llm_server.enqueue(*[Fault(status=500, retry_after_ms=5)] * 3)
    reply = await say(runtime, "second message")
    assert reply is not None
    assert reply.kind is ReplyKind.NOTICE
    assert reply.text == LLM_DOWN
    assert await store.latest_version() == before
    assert await store.pending_count() == 0
    assert runtime.registry.get(A.id).sponge.interaction_count == 1
    turns = await runtime.db.recent_turns(A.id, ALICE.id, max_turns=20, max_chars=10_000)
    assert [content for _, content in turns if content == "second message"] == []


async def test_overloaded_then_recovered_reply_arrives(runtime, llm_server):
    llm_server.enqueue(Fault(status=529, retry_after_ms=5), Text("Back on my feet."))
    reply = await say(runtime, "are you there?")
    assert reply is not None and reply.text == "Back on my feet."


async def test_llm_fault_on_ess_holds_learning_instead_of_using_defaults(runtime, llm_server):
    """Safe defaults are for malformed answers; an outage keeps the evidence for later."""
    llm_server.brain.ess_rule(**NUCLEAR)
    llm_server.enqueue(Text("A fine reply."), *[Fault(status=500, retry_after_ms=5)] * 3)
    reply = await say(runtime, STRONG_ARGUMENT)
    assert reply is not None and reply.text == "A fine reply."
    agent = runtime.registry.get(A.id)
    assert agent.learning_held and agent.sponge.interaction_count == 0
    assert await runtime.db.community(A.id).audit_events(kind="ess") == []
    agent.resume_learning()
    assert await eventually(lambda: agent.sponge.interaction_count == 1, 10)
    assert len(agent.sponge.staged_opinion_updates) == 1


async def test_malformed_ess_tool_input_is_retried(runtime, llm_server):
    llm_server.brain.ess_rule(**NUCLEAR)
    llm_server.enqueue(
        Text("ok"),
        ToolUse({"score": "very high", "topics": "nuclear"}),  # wrong types, missing fields
    )
    await say(runtime, STRONG_ARGUMENT)
    assert len(ess_requests(llm_server)) == 2
    state = runtime.registry.get(A.id).sponge
    assert len(state.staged_opinion_updates) == 1


async def test_empty_long_and_flooding_messages(tmp_path, llm, llm_server):
    settings = make_settings(tmp_path / "data", llm=llm, SONALITY_RATE_LIMIT_MESSAGES=2)
    async with open_runtime(settings, llm=llm) as runtime:
        assert await say(runtime, "   ") is None
        assert llm_server.requests == []
        long_text = "word " * 1500  # 7,500 characters
        reply = await say(runtime, long_text)
        assert reply is not None and reply.truncated
        assert "first 4,000 characters" in reply.text
        sent = chat_requests(llm_server)[-1].last_user_text
        said = re.search(r"<message>\n(.*)\n</message>", sent, re.DOTALL)
        assert said is not None and said.group(1) == long_text[:4000]
        reply = await say(runtime, "second")
        assert reply is not None and reply.kind is ReplyKind.ANSWER
        flood = await say(runtime, "third")
        assert flood is not None and flood.text == SLOW_DOWN
        assert await say(runtime, "fourth") is None
        assert len(chat_requests(llm_server)) == 2
        # Another user is not affected by Alice's flood.
        other = await say(runtime, "hi", user=BOB)
        assert other is not None and other.kind is ReplyKind.ANSWER


async def test_conversation_buffer_per_user_survives_restart(tmp_path, llm, llm_server):
    settings = make_settings(tmp_path / "data", llm=llm)
    async with open_runtime(settings, llm=llm) as runtime:
        await say(runtime, "My favourite tea is oolong.")
        await say(runtime, "What is my favourite tea?")
        second = chat_requests(llm_server)[-1]
        assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
        assert "oolong" in second.messages[0]["content"]
        await say(runtime, "hello", user=BOB)
        assert len(chat_requests(llm_server)[-1].messages) == 1
    async with open_runtime(settings, llm=llm) as runtime:
        await say(runtime, "Remind me?")
        after_restart = chat_requests(llm_server)[-1]
        assert "oolong" in after_restart.messages[0]["content"]
        assert len(after_restart.messages) == 5


async def test_reply_prompt_has_cached_identity_and_retrieved_memories(runtime, llm_server):
    llm_server.brain.ess_rule(**NUCLEAR)
    await say(runtime, STRONG_ARGUMENT)
    await say(runtime, "Tell me about sourdough bread.")
    unrelated = chat_requests(llm_server)[-1]
    assert "<relevant_memories>" not in prompt_of(unrelated)  # below min_relevance
    await say(runtime, "How dangerous are atomic power plants?")
    req = chat_requests(llm_server)[-1]
    blocks = req.system_blocks
    if isinstance(llm_server, AnthropicFake):  # Anthropic-only: caching is marked by us
        # Identity and rules lead; the mark sits where the prefix first reaches Sonnet's
        # 1,024-token minimum: the end of the narrative.
        assert "<core_identity>" in blocks[0]["text"] and "cache_control" not in blocks[0]
        assert blocks[-1].get("cache_control") == {"type": "ephemeral"}
        assert "<relevant_memories>" not in req.system_text
    else:  # OpenAI caches the longest repeated prefix: the identity must lead
        assert "cache_control" not in str(req.body)
        assert req.system_text.index("<core_identity>") < req.system_text.index(
            "<personality_state>"
        )
    # The semantic match came from real embeddings: "atomic energy" found the nuclear episode.
    assert "reactor fleet data" in prompt_of(req)
    assert "<relevant_memories>" in req.last_user_text


async def test_token_usage_is_recorded_per_community(runtime, llm_server):
    await say(runtime, "hello")
    totals = await runtime.db.usage_totals(A.id)
    assert totals.input_tokens > 0 and totals.output_tokens > 0
    other = await runtime.db.usage_totals("test:nobody")
    assert other.input_tokens == 0


async def test_a_failed_learning_attempt_still_counts_its_tokens(runtime, llm_server, caplog):
    """The ESS call is made and paid for, then the commit fails: the attempt is counted
    as failed, the ESS tokens are in the community's spend, and nothing was committed."""
    agent = await runtime.registry.agent_for(A)  # loaded (seed version committed) first
    before = await runtime.db.usage_totals(A.id)
    assert "evidence" not in before.by_role

    async def broken_commit(*_: Any, **__: Any) -> None:
        raise RuntimeError("disk full")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CommunityStore, "commit", broken_commit)
        reply = await runtime.handle(
            IncomingMessage(community=A, channel_id="c1", user=ALICE, text="hello there")
        )
        await runtime.drain()
    assert reply is not None and reply.kind is ReplyKind.ANSWER
    assert "post-processing of" in caplog.text and "disk full" in caplog.text
    totals = await runtime.db.usage_totals(A.id)
    assert totals.by_role["evidence"].input_tokens > 0
    assert len(ess_requests(llm_server)) == 1
    assert agent.sponge.interaction_count == 0
    assert await runtime.db.community(A.id).pending_count() == 1  # replayed on next start


async def test_an_episode_is_embedded_from_its_summary_not_the_message(runtime, llm_server):
    """The reply path embeds the message to recall memories, but the episode's vector is
    its summary's (the one space all memories share), and it carries that vector while
    it waits for its batched write, so it can be ranked meanwhile."""
    llm_server.brain.ess_rule(**NUCLEAR)
    await runtime.handle(
        IncomingMessage(community=A, channel_id="c1", user=ALICE, text=STRONG_ARGUMENT)
    )
    agent = runtime.registry.get(A.id)
    assert await eventually(lambda: agent.sponge.interaction_count == 1, seconds=5)
    [waiting] = await runtime.db.community(A.id).pending_episodes()
    # Each alone, as the lane embedded the summary: the bot's int8 model gives a text
    # a vector that moves a little with its batch companions.
    (summary_vector,) = agent.episodes.embed_many([str(NUCLEAR["summary"])])
    (message_vector,) = agent.episodes.embed_many([STRONG_ARGUMENT])
    assert waiting.embedding is not None
    assert _cosine(waiting.embedding, summary_vector) > 0.999
    assert _cosine(waiting.embedding, message_vector) < 0.9

    await runtime.drain()
    by_summary = agent.episodes.retrieve(str(NUCLEAR["summary"]), min_relevance=0.99)
    assert by_summary == [NUCLEAR["summary"]]
    assert agent.episodes.retrieve(STRONG_ARGUMENT, min_relevance=0.99) == []


async def test_a_replayed_interaction_joins_the_same_space(runtime, llm_server):
    """An interaction answered before a crash and learned after the restart (no vector of
    its message survives) is embedded from its summary like one learned live."""
    llm_server.brain.ess_rule(**BUS_LANES)
    message = "Bus lanes on Main St cut average journey times by 4 minutes in the pilot."
    await runtime.db.community(A.id).record_interaction(
        InteractionRecord(
            id="answered-before-the-crash",
            speaker=Speaker(id=ALICE.id, name=ALICE.name),
            message=message,
            reply="Interesting.",
        )
    )
    agent = await runtime.registry.agent_for(A)  # replays the interaction
    await runtime.drain()
    assert agent.sponge.interaction_count == 1
    summary = str(BUS_LANES["summary"])
    assert agent.episodes.retrieve(summary, min_relevance=0.99) == [summary]
    assert agent.episodes.retrieve(message, min_relevance=0.99) == []


async def test_a_memory_whose_embedding_failed_is_embedded_by_the_store(
    runtime, llm_server, monkeypatch, caplog
):
    """Learning does not wait on the embedding model: if embedding the summary fails,
    the episode is committed without a vector and the store embeds the same summary."""
    llm_server.brain.ess_rule(**NUCLEAR)
    agent = await runtime.registry.agent_for(A)
    lane = agent.memory.lane  # the runtime's write-behind memory
    embed = lane.embed

    async def summaries_fail(text: str) -> Any:
        if text == NUCLEAR["summary"]:
            raise RuntimeError("embedding model unavailable")
        return await embed(text)

    monkeypatch.setattr(lane, "embed", summaries_fail)
    await say(runtime, STRONG_ARGUMENT)
    assert "could not embed new memories" in caplog.text
    assert agent.sponge.interaction_count == 1
    summary = str(NUCLEAR["summary"])
    assert agent.episodes.retrieve(summary, min_relevance=0.99) == [summary]


@pytest.mark.parametrize("int8", [True, False])
async def test_the_runtime_embeds_with_the_int8_model_unless_told_not_to(
    tmp_path, llm, llm_server, int8
):
    """SONALITY_EMBEDDING_INT8 (default true) picks the model a memory's vector comes
    from: the int8 copy's vector of its summary, or with false the float model's."""
    llm_server.brain.ess_rule(**NUCLEAR)
    overrides = {} if int8 else {"SONALITY_EMBEDDING_INT8": False}
    settings = make_settings(tmp_path / "data", llm=llm, **overrides)
    async with open_runtime(settings, llm=llm) as runtime:
        await runtime.handle(
            IncomingMessage(community=A, channel_id="c1", user=ALICE, text=STRONG_ARGUMENT)
        )
        agent = runtime.registry.get(A.id)
        assert agent is not None
        assert await eventually(lambda: agent.sponge.interaction_count == 1, seconds=5)
        [waiting] = await runtime.db.community(A.id).pending_episodes()  # not yet written
    summary = str(NUCLEAR["summary"])
    cache = settings.resolved_model_cache_dir
    quick = [float(x) for x in default_embedding_function(cache, quantized=True)([summary])[0]]
    exact = [float(x) for x in default_embedding_function(cache)([summary])[0]]
    chosen, other = (quick, exact) if int8 else (exact, quick)
    assert waiting.embedding is not None
    assert _cosine(waiting.embedding, chosen) > 0.99999
    assert _cosine(waiting.embedding, other) < 0.9999


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def test_a_memory_store_fault_does_not_cost_the_reply(tmp_path, llm, llm_server, caplog):
    """Chroma failing a query (a real error seen under load) degrades to no memories.
    Chroma's client runs in this process, so the fault can be put into it."""
    settings = make_settings(tmp_path / "data", llm=llm)
    async with open_runtime(settings, llm=llm) as runtime:
        llm_server.brain.ess_rule(**NUCLEAR)
        await say(runtime, STRONG_ARGUMENT)
        agent = runtime.registry.get(A.id)
        assert agent is not None

        def unreadable(*_: Any, **__: Any) -> None:
            """Stands in for an index that cannot be read right now."""
            raise RuntimeError("Error creating hnsw segment reader: Nothing found on disk")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Collection, "query", unreadable)
            reply = await runtime.handle(
                IncomingMessage(
                    community=A,
                    channel_id="c1",
                    user=ALICE,
                    text="How dangerous are atomic plants?",
                )
            )
        await runtime.drain()
        assert reply is not None and reply.kind is ReplyKind.ANSWER
        assert "<relevant_memories>" not in prompt_of(chat_requests(llm_server)[-1])
        assert "memory retrieval failed" in caplog.text
        assert agent.sponge.interaction_count == 2  # learning still happened


async def test_memories_waiting_for_a_batched_write_are_still_recalled(runtime, llm_server):
    """Episodes reach Chroma in batches; until then retrieval ranks them in memory, so
    another user's question already finds the argument made a moment ago."""
    llm_server.brain.ess_rule(**NUCLEAR)
    await runtime.handle(
        IncomingMessage(community=A, channel_id="c1", user=ALICE, text=STRONG_ARGUMENT)
    )
    agent = runtime.registry.get(A.id)
    # Learning commits in the background.
    assert await eventually(lambda: agent.sponge.interaction_count == 1, seconds=5)
    assert agent.episodes.count() == 0  # committed, not yet written to Chroma

    await bob_asks_about_atomic_plants(runtime, llm_server)

    await runtime.drain()  # drain forces the batch out
    assert agent.episodes.count() == 2
    assert NUCLEAR["summary"] in agent.episodes.retrieve(ATOMIC_QUESTION)


async def test_episodes_without_a_vector_are_written_at_once(runtime):
    """An episode left in the outbox without a vector (its embedding failed) cannot wait
    in memory for a batch: it reaches Chroma right away, not after the delay."""
    lost = Episode(id="replayed", user_message="m", summary="Replayed after a restart")
    await runtime.db.community(A.id).commit(
        StateCommit(state=SpongeState(), cause="seed", change="seed", episodes=[lost])
    )
    agent = await runtime.registry.agent_for(A)
    # Far below EPISODE_FLUSH_DELAY.
    assert await eventually(lambda: agent.episodes.count() == 1, seconds=3)


async def test_the_runtime_keeps_its_state_where_database_url_says(
    runtime: Any,
    database_url: str | None,
    tmp_path: Any,
) -> None:
    await say(runtime, "hello there")
    assert runtime.db.engine_name == ("sqlite" if database_url is None else "postgresql")
    assert await runtime.db.community(A.id).latest_version() is not None
    files = list((tmp_path / "data").glob("*.sqlite3"))
    if database_url is None:
        assert files == [runtime.db.path]
    else:
        assert files == []
        with pytest.raises(StorageError, match="no file"):
            _ = runtime.db.path


async def test_the_runtime_keeps_its_episodes_where_the_stack_says(
    runtime: Any, llm_server: Any, stack: Stack
) -> None:
    """On the scale-out stack an episode is in the Chroma server (read back there with
    chromadb's own client) and nothing is written to a local Chroma directory."""
    llm_server.brain.ess_rule(**NUCLEAR)
    await say(runtime, STRONG_ARGUMENT)
    agent = runtime.registry.get(A.id)
    await agent.flush_episodes()
    local = runtime.settings.resolved_chroma_dir
    if not stack.on_chroma_server:
        assert not isinstance(runtime.memory, ServerMemory)
        assert local.is_dir()
        return
    assert isinstance(runtime.memory, ServerMemory)
    assert not local.exists()
    assert stack.chroma is not None
    host, port = stack.chroma.url.removeprefix("http://").split(":")
    client = chromadb.HttpClient(
        host=host, port=int(port), database=runtime.settings.chroma_database
    )
    stored = [
        document
        for collection in client.list_collections()
        for document in client.get_collection(collection.name).get()["documents"] or []
    ]
    assert stored == [NUCLEAR["summary"]]
