"""Prompt caching through the whole bot, against the fake that applies Anthropic's rules.

The bench (figure 5) measures 85% of the reply calls' prompt tokens read from the cache
over 60 messages; a single member's steady conversation must reach well over half.
"""

from __future__ import annotations

from sonality.llm import Usage
from tests.integration.conftest import A, say


def read_share(usage: Usage) -> float:
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    return usage.cache_read_tokens / prompt


async def test_a_steady_conversation_reads_most_of_its_prompt_from_the_cache(
    runtime, anthropic_server
):
    for i in range(12):
        await say(runtime, f"Tell me something about rivers, part {i}.")
    totals = await runtime.db.usage_totals(A.id)
    reply = totals.by_role["reply"]
    assert reply.cache_read_tokens > 0
    assert read_share(reply) >= 0.6
    # Each read is of a prefix written before: never more read than was ever written.
    assert reply.cache_read_tokens <= 12 * reply.cache_write_tokens
    # The evidence model (Haiku 4.5, minimum 4,096 tokens) never reaches its minimum.
    evidence = totals.by_role["evidence"]
    assert evidence.cache_read_tokens == 0 and evidence.cache_write_tokens == 0


async def test_a_new_narrative_starts_a_new_cache_but_the_rules_never_change(
    runtime, anthropic_server
):
    """The system prompt's first block is the same for every community and version."""
    await say(runtime, "hello")
    first = [r for r in anthropic_server.requests if "<personality_state>" in r.system_text]
    agent = runtime.registry.get(A.id)
    agent.sponge = agent.sponge.model_copy(update={"snapshot": "I now love maps. " * 10})
    await say(runtime, "hello again")
    second = [r for r in anthropic_server.requests if "<personality_state>" in r.system_text]
    assert first[0].system_blocks[0]["text"] == second[-1].system_blocks[0]["text"]
    assert first[0].system_blocks[1]["text"] != second[-1].system_blocks[1]["text"]
