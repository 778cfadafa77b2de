"""Streamed replies on Discord, end to end: real discord.py against the fake Discord
(which enforces Discord's per-channel edit limit with 429s), the real runtime, the
anthropic SDK against the fake streaming at a fixed rate.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import adapters.discord as discord_adapter
from adapters.chunking import split_message
from bot.messages import CUT_OFF
from tests.fakes.anthropic_server import Broken, Text
from tests.integration.test_discord_e2e import World, delivered_to, mention, replies_to, settle
from tests.integration.test_discord_e2e import world as e2e_world  # noqa: F401


@pytest.fixture
def world(e2e_world: World) -> World:  # noqa: F811 (the imported fixture, by name)
    """The end-to-end world of test_discord_e2e (two guilds, real runtime)."""
    return e2e_world


ANSWER = " ".join(f"Point {i} of the answer is plain and short." for i in range(12))


def contents_shown(world: World, trigger: dict[str, Any]) -> list[str]:
    """Every text the member could see: each first post and each edit, in order."""
    posted = [p.json["content"] for p in replies_to(world, trigger)]
    ids = {int(m["id"]) for m in delivered_to(world, trigger)}
    return posted + [content for mid, content in world.fake.edits if mid in ids]


async def test_a_streamed_reply_is_a_first_message_then_edits(world: World) -> None:
    world.anthropic.tokens_per_second = 30.0  # ~100 words: about 3 s of writing
    world.anthropic.enqueue(Text(ANSWER))
    trigger, posts = await mention(world, world.guild_a, "tell me everything")
    [post] = posts
    [message] = delivered_to(world, trigger)
    assert message["content"] == ANSWER
    # The first post came early, with a finished sentence, not the whole answer.
    assert post.json["content"].startswith("Point 0") and len(post.json["content"]) < len(ANSWER)
    edits = [c for mid, c in world.fake.edits if mid == int(message["id"])]
    assert len(edits) >= 2 and edits[-1] == ANSWER
    for before, after in itertools.pairwise(edits):
        assert after.startswith(before.rstrip())  # each edit only adds text
    assert world.agent(world.guild_a).sponge.interaction_count == 1


async def test_fences_stay_balanced_and_the_split_holds_while_streaming(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discord_adapter, "EDIT_EVERY", 0.05)  # many intermediate states
    world.fake.edit_limit = 1000  # this test is about content, not the rate limit
    code = "\n".join(f"    step_{i} = compute({i})  # explain" for i in range(80))
    answer = "Here is how.\n\n```python\n" + code + "\n```\n\n" + "And that is all. " * 40
    assert 3000 <= len(answer) < 4000
    world.anthropic.tokens_per_second = 400.0
    world.anthropic.enqueue(Text(answer))
    # The reply as the engine keeps it (stripped), split as if sent whole.
    expected = split_message(answer.strip(), discord_adapter.MESSAGE_LIMIT)
    assert len(expected) >= 2
    trigger, posts = await mention(
        world, world.guild_a, "show me the pipeline", posts=len(expected)
    )
    shown = contents_shown(world, trigger)
    assert len(shown) > 6
    for content in shown:
        assert content.count("```") % 2 == 0, content[-200:]
        assert len(content) <= 2000
    final = sorted(delivered_to(world, trigger), key=lambda m: int(m["id"]))
    # The same messages as an answer sent whole: the 2,000 split held while streaming.
    assert [m["content"] for m in final] == expected and len(posts) == len(expected)
    joined = "".join(m["content"] for m in final)
    assert joined.count("```python") >= 2  # closed in one message, reopened in the next
    for i in (0, 40, 79):
        assert f"step_{i} = compute({i})" in joined
    assert final[-1]["content"].rstrip().endswith("And that is all.")


async def test_edits_faster_than_discord_allows_are_rate_limited_and_still_land(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discord_adapter, "EDIT_EVERY", 0.05)
    world.fake.edit_limit, world.fake.edit_window = 3, 1.0
    world.anthropic.tokens_per_second = 60.0
    world.anthropic.enqueue(Text(ANSWER))
    trigger, _ = await mention(world, world.guild_a, "tell me everything")
    [message] = delivered_to(world, trigger)
    assert message["content"] == ANSWER
    # discord.py read the X-RateLimit headers (and waited out any 429) by itself.
    edits = [c for mid, c in world.fake.edits if mid == int(message["id"])]
    assert edits[-1] == ANSWER
    times = world.fake.edit_times
    assert len(times) > 3  # more edits than one window allows were made
    # None got past the limit: at most 3 accepted edits in any 1 s window.
    assert all(sum(1 for t in times if s <= t < s + 1.0) <= 3 for s in times)


async def test_a_stream_broken_part_way_ends_with_a_note_and_nothing_learned(
    world: World,
) -> None:
    a = world.guild_a
    await mention(world, a, "hello there")
    agent = world.agent(a)
    store = world.runtime.db.community(world.community(a))
    count = agent.sponge.interaction_count
    world.anthropic.tokens_per_second = 40.0
    world.anthropic.enqueue(Broken(ANSWER, after=120, how="error"))
    trigger, _ = await mention(world, a, "tell me everything")
    await settle(world)
    [message] = delivered_to(world, trigger)
    shown, _, note = message["content"].rpartition("\n\n")
    assert note == CUT_OFF
    assert 120 <= len(shown) < len(ANSWER) and ANSWER.startswith(shown)
    assert agent.sponge.interaction_count == count
    assert await store.pending_count() == 0
