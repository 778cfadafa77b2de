"""Forget-me and forget-user through real slack-bolt against the loopback Slack.

Why: the forgetting itself is proven in test_forget_core.py; this checks a Slack member
can reach it, privately, that nothing happens without `confirm`, and that the member's
own export is empty afterwards while another member's is untouched. The typed flow is
what an app created from the old manifest (no buttons) keeps; the buttons of the
current one are in test_slack_agent_e2e.py.
"""

from __future__ import annotations

import json

from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.slack_server import OLD_MANIFEST_SCOPES, Identity
from tests.integration.test_slack_e2e import SlackBot, bot  # noqa: F401
from tests.slack.conftest import fake_slack, http_session  # noqa: F401

TOKEN = "quokkalantern38"
OTHER = "heronparasol52"


def _rate(server: AnthropicFake, contains: str) -> None:
    server.brain.ess_rule(
        contains=contains,
        score=0.8,
        reasoning_type="empirical_data",
        topics=["remote_work"],
        direction="supports",
        summary="The sender cites a study about remote work.",
    )


async def _export(bot: SlackBot, user: str) -> bytes:  # noqa: F811
    await bot.command("my-data", user=user)
    return bot.fake.shared_files()[-1].data or b""


async def test_forget_me_on_slack_asks_first_then_forgets(
    bot: SlackBot,  # noqa: F811
    anthropic_server: AnthropicFake,
) -> None:
    bot.fake.default_identity = Identity(scopes=OLD_MANIFEST_SCOPES)
    _rate(anthropic_server, TOKEN)
    _rate(anthropic_server, OTHER)
    await bot.mention(f"<@UBOT> A 2023 study ({TOKEN}) found remote work helps.", user="U1")
    await bot.mention(f"<@UBOT> My own study ({OTHER}) agrees.", user="U2")

    asked = await bot.command("forget-me", user="U1")
    assert asked["response_type"] == "ephemeral" and "blocks" not in asked
    assert "`/sonality forget-me confirm`" in asked["text"]
    assert TOKEN.encode() in await _export(bot, "U1")  # nothing forgotten yet

    done = await bot.command("forget-me confirm", user="U1")
    assert done["response_type"] == "ephemeral"
    mine = await _export(bot, "U1")
    assert TOKEN.encode() not in mine and json.loads(mine)["messages"] == []
    theirs = await _export(bot, "U2")
    assert OTHER.encode() in theirs and len(json.loads(theirs)["messages"]) == 1


async def test_forget_user_is_for_moderators_only_on_slack(
    bot: SlackBot,  # noqa: F811
    anthropic_server: AnthropicFake,
) -> None:
    answer = await bot.command("forget-user U2 asked by e-mail", user="U1")
    assert answer["response_type"] == "ephemeral"
    assert "Only moderators" in answer["text"]


async def test_forget_user_on_slack_takes_a_mention_or_a_name(
    bot: SlackBot,  # noqa: F811
    anthropic_server: AnthropicFake,
) -> None:
    """Issue 22, finding 4: `<@U2|bob>` (escaped mentions), `<@U2>` and `@Bob` name the
    member exactly; a mention of someone never seen here forgets nothing."""
    _rate(anthropic_server, TOKEN)
    _rate(anthropic_server, OTHER)
    await bot.mention(f"<@UBOT> A 2023 study ({TOKEN}) found remote work helps.", user="U1")
    await bot.mention(f"<@UBOT> My own study ({OTHER}) agrees.", user="U2")
    store = (await bot.agent("slack:T1")).store
    versions = await store.versions(limit=100)

    for stranger in ("<@U9|zed> asked by e-mail", "<@U9> asked by e-mail", "@Zed asked"):
        refused = await bot.command(f"forget-user {stranger}", user="UADMIN")
        assert "Nothing was forgotten" in refused["text"], refused
    assert await store.versions(limit=100) == versions

    done = await bot.command("forget-user <@U2|bob> asked by e-mail", user="UADMIN")
    assert "Forgotten" in done["text"], done
    assert json.loads(await _export(bot, "U2"))["messages"] == []
    assert TOKEN.encode() in await _export(bot, "U1")
    [logged, *_] = await bot.runtime.db.moderator_actions("slack:T1")
    assert (logged.reason, logged.args) == ("asked by e-mail", "(member withheld)")

    done = await bot.command("forget-user @Alice she asked in a DM", user="UADMIN")
    assert "Forgotten" in done["text"], done
    assert json.loads(await _export(bot, "U1"))["messages"] == []
