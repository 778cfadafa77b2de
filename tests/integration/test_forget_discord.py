"""Forget-me and forget-user through real discord.py against the loopback Discord.

Why: the engine and storage side of forgetting is proven in test_forget_core.py; this
checks that a Discord member can reach it (the subcommands, their options, a private
answer) and that what the member asked to be forgotten is gone afterwards, as the
member's own export shows.
"""

from __future__ import annotations

import json

from tests.fakes.discord_fixtures import is_ephemeral
from tests.integration.test_discord_e2e import World, mention, slash, world  # noqa: F401

TOKEN = "zebracrossing71"
ARGUMENT = f"A 2023 meta-analysis of 40 trials ({TOKEN}) shows remote work raises output."


async def test_forget_me_asks_first_then_forgets_the_member(world: World) -> None:  # noqa: F811
    world.anthropic.brain.ess_rule(
        contains=TOKEN,
        score=0.8,
        reasoning_type="empirical_data",
        topics=["remote_work"],
        direction="supports",
        summary="The sender cites a meta-analysis in favour of remote work.",
    )
    await mention(world, world.guild_a, ARGUMENT)

    callback, patch = await slash(world, world.guild_a, "forget-me")
    assert is_ephemeral(callback)
    assert "forget-me confirm" in patch.json["content"] or "confirm" in patch.json["content"]
    _, before = await slash(world, world.guild_a, "my-data")
    [(_, data)] = before.files
    assert TOKEN.encode() in data  # nothing was forgotten without confirmation

    callback, patch = await slash(
        world,
        world.guild_a,
        "forget-me",
        options=[{"name": "confirm", "type": 5, "value": True}],
    )
    assert is_ephemeral(callback)
    _, after = await slash(world, world.guild_a, "my-data")
    [(_, data)] = after.files
    export = json.loads(data)
    assert TOKEN.encode() not in data
    assert export["messages"] == []


async def test_forget_user_is_refused_to_a_member(world: World) -> None:  # noqa: F811
    callback, patch = await slash(
        world,
        world.guild_a,
        "forget-user",
        options=[
            {"name": "member", "type": 6, "value": str(world.moderator.id)},
            {"name": "reason", "type": 3, "value": "asked by e-mail"},
        ],
    )
    assert is_ephemeral(callback)
    assert "Only moderators" in patch.json["content"]
