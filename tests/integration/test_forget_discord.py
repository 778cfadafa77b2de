"""Forget-me and forget-user through real discord.py against the loopback Discord.

Why: the engine and storage side of forgetting is proven in test_forget_core.py (and on
every platform in test_forget_acceptance.py); this checks how a Discord member reaches
it: a private question with Confirm and Cancel buttons, where only the member who asked
can press, a press runs it once, Cancel and an expired question change nothing. The
loopback Discord delivers button presses (MESSAGE_COMPONENT interactions) and holds the
bot to Discord's interaction rules (first response within 3 s, only one), which the
last test checks on the fake itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from adapters.discord_confirm import CANCELLED, NOT_YOURS, expired_text
from tests.fakes.discord_fixtures import is_ephemeral
from tests.fakes.discord_server import FakeInteraction, FakeUser, RecordedRequest
from tests.integration.test_discord_e2e import (  # noqa: F401 (fixture "world")
    WAIT,
    World,
    mention,
    settle,
    slash,
    world,
)

TOKEN = "zebracrossing71"
ARGUMENT = f"A 2023 meta-analysis of 40 trials ({TOKEN}) shows remote work raises output."


def _rate(stack: World) -> None:
    stack.anthropic.brain.ess_rule(
        contains=TOKEN,
        score=0.8,
        reasoning_type="empirical_data",
        topics=["remote_work"],
        direction="supports",
        summary="The sender cites a meta-analysis in favour of remote work.",
    )


async def _export(stack: World) -> bytes:
    _, answer = await slash(stack, stack.guild_a, "my-data")
    [(_, data)] = answer.files
    return data


async def _ask(stack: World) -> tuple[dict[str, Any], str]:
    """/sonality forget-me: the question as the fake holds it (content, buttons), and
    the interaction's token."""
    callback, _ = await slash(stack, stack.guild_a, "forget-me")
    assert is_ephemeral(callback)
    token = callback.path.split("/")[3]
    message = stack.fake.interactions[token].message
    assert message is not None
    return message, token


async def _press(
    stack: World, message: dict[str, Any], label: str, user: FakeUser | None = None
) -> tuple[RecordedRequest, str]:
    """Press a button; returns the bot's callback to the press and the press's token."""
    iid, token = await stack.fake.press(
        guild=stack.guild_a, user=user or stack.member, message=message, label=label
    )
    [callback] = await stack.fake.wait_for(
        lambda r: r.method == "POST" and r.path == f"/interactions/{iid}/{token}/callback",
        seconds=WAIT,
    )
    return callback, token


async def test_forget_me_asks_with_buttons_and_forgets_on_confirm(world: World) -> None:  # noqa: F811
    _rate(world)
    await mention(world, world.guild_a, ARGUMENT)

    question, _ = await _ask(world)
    assert "Press Confirm" in question["content"]
    assert set(world.fake.buttons(question)) == {"Confirm", "Cancel"}
    assert TOKEN.encode() in await _export(world)  # nothing forgotten by asking

    # Another member's press is refused privately and changes nothing.
    refused, _ = await _press(world, question, "Confirm", user=world.moderator)
    assert refused.json["type"] == 4 and refused.json["data"]["content"] == NOT_YOURS
    assert is_ephemeral(refused)
    assert set(world.fake.buttons(question)) == {"Confirm", "Cancel"}

    pressed, token = await _press(world, question, "Confirm")
    assert pressed.json["type"] == 7  # the question is replaced at once…
    assert pressed.json["data"]["components"] == []
    original = f"/webhooks/{world.fake.application_id}/{token}/messages/@original"
    [done] = await world.fake.wait_for(
        lambda r: r.method == "PATCH" and r.path == original, seconds=WAIT
    )
    await settle(world)
    assert "Forgotten" in done.json["content"]  # …then answered when the forget is done
    assert "Forgotten" in question["content"] and world.fake.buttons(question) == {}
    data = await _export(world)
    assert TOKEN.encode() not in data and json.loads(data)["messages"] == []


async def test_a_double_click_on_confirm_forgets_once(world: World) -> None:  # noqa: F811
    """Two presses read before either callback runs (a double click): discord.py starts
    a callback for each; the second is only acknowledged, the forget-me runs once."""
    _rate(world)
    await mention(world, world.guild_a, ARGUMENT)
    question, _ = await _ask(world)
    ran: list[tuple[str, tuple[str, ...]]] = []
    run = world.runtime.run_command

    async def counted(request: Any) -> Any:
        ran.append((request.name, request.args))
        return await run(request)

    world.runtime.run_command = counted  # type: ignore[method-assign]
    presses = await asyncio.gather(
        *(
            world.fake.press(
                guild=world.guild_a, user=world.member, message=question, label="Confirm"
            )
            for _ in range(2)
        )
    )
    callbacks = []
    for iid, token in presses:
        path = f"/interactions/{iid}/{token}/callback"

        def answered(r: RecordedRequest, path: str = path) -> bool:
            return r.method == "POST" and r.path == path

        callbacks += await world.fake.wait_for(answered, seconds=WAIT)
    await settle(world)
    assert ran == [("forget-me", ("confirm",))]
    assert sorted(c.json["type"] for c in callbacks) == [6, 7]  # acknowledged, answered


async def test_cancel_and_expiry_forget_nothing(world: World) -> None:  # noqa: F811
    _rate(world)
    await mention(world, world.guild_a, ARGUMENT)

    question, _ = await _ask(world)
    cancelled, _ = await _press(world, question, "Cancel")
    assert cancelled.json["type"] == 7 and cancelled.json["data"]["content"] == CANCELLED
    assert world.fake.buttons(question) == {}

    world.adapter.confirm_timeout = 0.3
    question, token = await _ask(world)
    original = f"/webhooks/{world.fake.application_id}/{token}/messages/@original"
    # The question's own edit, then the expiry notice.
    await world.fake.wait_for(
        lambda r: r.method == "PATCH" and r.path == original, count=2, seconds=WAIT
    )
    assert world.fake.buttons(question) == {}
    assert question["content"] == expired_text("forget-me")
    assert TOKEN.encode() in await _export(world)


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


async def test_the_fake_holds_the_bot_to_discords_interaction_rules(
    world: World,  # noqa: F811
) -> None:
    """One response per interaction, the first within 3 s, a type that fits the
    interaction, and the interaction's webhook only once it is answered. Checked on
    interactions the bot never sees, answered by hand."""
    fake = world.fake
    channel = world.guild_b.channels[0].id

    def interaction(token: str, kind: int = 2, age: float = 0.0) -> str:
        iid = fake.snowflake()
        fake.interactions[token] = FakeInteraction(
            iid, token, kind, time.monotonic() - age, channel
        )
        return f"{fake.api_base}/interactions/{iid}/{token}/callback"

    async with aiohttp.ClientSession() as http:
        first = interaction("tok-rules-1")
        edit = f"{fake.api_base}/webhooks/{fake.application_id}/tok-rules-1/messages/@original"
        early = await http.patch(edit, json={"content": "too soon"})
        assert early.status == 404 and (await early.json())["code"] == 10015
        assert (await http.post(first, json={"type": 5, "data": {"flags": 64}})).status == 204
        again = await http.post(first, json={"type": 4, "data": {"content": "x"}})
        assert again.status == 400 and (await again.json())["code"] == 40060
        edited = await http.patch(edit, json={"content": "done"})
        assert edited.status == 200 and (await edited.json())["content"] == "done"

        late = await http.post(interaction("tok-rules-2", age=3.5), json={"type": 5})
        assert late.status == 404 and (await late.json())["code"] == 10062
        # Updating "the message" (7) answers only a button press.
        wrong = await http.post(interaction("tok-rules-3"), json={"type": 7, "data": {}})
        assert wrong.status == 400
