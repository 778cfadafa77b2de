"""Deleting or editing a message on Discord takes its influence back (issue 25, item 4),
through the real discord.py against the fake Discord's gateway events (MESSAGE_DELETE,
MESSAGE_DELETE_BULK, MESSAGE_UPDATE) and the real runtime.

The argument that moved a belief (committed after the cooling period) is deleted: the
opinions then equal, within 1e-9, those of a server that never saw it (the same other
messages, the same ESS results); its word, its Discord id and its interaction id are in
no table and no file of Chroma; the version says "deleted by its author". A deletion of
a message the bot never answered changes nothing. An edit takes back the old words and
answers the new ones as a new message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from bot.messages import Community
from providers.anthropic import AnthropicLLM
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.discord_fixtures import restores_discord_endpoints  # noqa: F401 (fixture)
from tests.fakes.discord_server import FakeUser
from tests.integration.conftest import command, make_settings
from tests.integration.deletion_scenario import (
    ARGUER,
    CHATTER,
    CONVERSATION,
    CRITIC,
    EDITED,
    OWN_TOPIC,
    WORD,
    Role,
    deletion_rows,
    interaction_of,
    play,
    tables_holding,
    taken_back,
    teach,
    until,
)
from tests.integration.forget_scenario import (
    assert_same_opinions_rebased,
    differs_somewhere,
    files_holding,
    no_automatic_reflection,  # noqa: F401 (fixture)
)
from tests.integration.test_discord_e2e import WAIT, World, mention, replies_to, settle
from tests.integration.test_forget_acceptance import discord_world

pytestmark = pytest.mark.usefixtures("no_automatic_reflection")

USERS = {
    ARGUER: FakeUser(731482659012345701, "ari", "Ari"),
    CRITIC: FakeUser(731482659012345702, "crit", "Cris"),
    CHATTER: FakeUser(731482659012345703, "chat", "Chas"),
}


def two_servers(
    data_dir: Path, llm: AnthropicLLM, anthropic: AnthropicFake
) -> contextlib.AbstractAsyncContextManager[World]:
    """Two servers with the same three members; the bot in both."""
    return discord_world(data_dir, llm, anthropic, tuple(USERS.values()))


def speaker(world: World) -> Callable[[str, Role, str], Awaitable[dict[str, Any]]]:
    guilds = {
        World.community(world.guild_a): world.guild_a,
        World.community(world.guild_b): world.guild_b,
    }

    async def say(community: str, role: Role, text: str) -> dict[str, Any]:
        trigger, _ = await mention(world, guilds[community], text, author=USERS[role])
        return trigger

    return say


async def test_a_deleted_argument_takes_its_influence_back(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    async with two_servers(tmp_path / "data", llm, anthropic_server) as world:
        whole, fresh = World.community(world.guild_a), World.community(world.guild_b)
        played = await play(speaker(world), whole, fresh)
        trigger = played.deleted
        agent, never_saw = world.agent(world.guild_a), world.agent(world.guild_b)
        heard_all = agent.sponge.model_copy(deep=True)
        # It moved a belief past the cooling period: its own topic is committed.
        assert OWN_TOPIC in heard_all.opinion_vectors
        assert differs_somewhere(heard_all, never_saw.sponge)
        interaction_id = await interaction_of(world.runtime.db, f"discord:{trigger['id']}")
        needles = [WORD, trigger["id"], interaction_id]
        assert await tables_holding(world.runtime.db, needles)
        versions = len(await world.runtime.db.community(whole).versions(limit=1000))

        # A message nobody asked the bot about, deleted: nothing changes.
        unseen = await world.fake.message_create(
            channel=world.guild_a.channels[0], author=USERS[CHATTER], content="brb, lunch"
        )
        rows = await deletion_rows(world.runtime.db)
        await world.fake.message_delete(unseen)

        async def tombstone_written() -> bool:
            return await deletion_rows(world.runtime.db) > rows

        await until(tombstone_written, "the deletion of an unseen message")
        assert len(await world.runtime.db.community(whole).versions(limit=1000)) == versions
        assert agent.sponge == heard_all

        # The argument, deleted by its author.
        await world.fake.message_delete(trigger)

        ref = f"discord:{trigger['id']}"
        await until(taken_back(world.runtime.db, ref), "the argument to be taken back")
        assert_same_opinions_rebased(agent.sponge, never_saw.sponge)
        assert differs_somewhere(agent.sponge, heard_all)
        assert OWN_TOPIC not in agent.sponge.opinion_vectors
        [latest] = await world.runtime.db.community(whole).versions(limit=1)
        assert latest.cause == "message-deleted"
        assert "deleted by its author" in latest.change and WORD not in latest.change
        await agent.flush_episodes()
        assert await tables_holding(world.runtime.db, needles) == []
        assert agent.episodes.stored([interaction_id]) == []
        # The other messages are still remembered, and the bot still answers.
        others = await world.runtime.db._fetchall(
            "SELECT COUNT(*) FROM interactions WHERE community_id = ?", (whole,)
        )
        assert others == [(len(CONVERSATION) - 1,)]
        _, posts = await mention(world, world.guild_a, "Still there?", author=USERS[CRITIC])
        assert len(posts) == 1
    # Chroma's files (its own log of operations keeps the deleted episode's id, a random
    # one that no row names any more, so the id is checked through Chroma above).
    assert files_holding([settings.resolved_chroma_dir], [WORD, trigger["id"]]) == []


async def test_a_moderators_purge_takes_the_messages_back_too(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    """MESSAGE_DELETE_BULK (a purge, or a ban that deletes messages) says as little as
    MESSAGE_DELETE: every message it lists is taken back."""
    teach(anthropic_server.brain)
    async with two_servers(tmp_path / "data", llm, anthropic_server) as world:
        whole, fresh = World.community(world.guild_a), World.community(world.guild_b)
        played = await play(speaker(world), whole, fresh)
        agent, never_saw = world.agent(world.guild_a), world.agent(world.guild_b)
        chatter = await world.fake.message_create(
            channel=world.guild_a.channels[0], author=USERS[CHATTER], content="spam spam"
        )
        await world.fake.message_delete_bulk([played.deleted, chatter])

        ref = f"discord:{played.deleted['id']}"
        await until(taken_back(world.runtime.db, ref), "the purge")
        assert_same_opinions_rebased(agent.sponge, never_saw.sponge)


async def test_a_purge_of_the_whole_conversation_leaves_nothing_learned(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    """Every message of a bulk delete waits for the community's agent at once, and
    messages waiting together are taken back in one replay (`withdraw_message`): the
    versions that replay name every purged message that taught the bot something, each
    once, and with all of them gone nothing learned is left."""
    teach(anthropic_server.brain)
    async with two_servers(tmp_path / "data", llm, anthropic_server) as world:
        whole, fresh = World.community(world.guild_a), World.community(world.guild_b)
        said = speaker(world)
        triggers: list[dict[str, Any]] = []

        async def say(community: str, role: Role, text: str) -> dict[str, Any]:
            trigger = await said(community, role, text)
            if community == whole:
                triggers.append(trigger)
            return trigger

        await play(say, whole, fresh)
        agent = world.agent(world.guild_a)
        assert agent.sponge.opinion_vectors  # the arguments moved beliefs
        db = world.runtime.db
        deletes: list[set[str]] = []
        forget = agent.memory.forget

        async def counted(ids: Collection[str]) -> None:
            deletes.append(set(ids))
            await forget(ids)

        agent.memory.forget = counted  # type: ignore[method-assign]
        await world.fake.message_delete_bulk(triggers)

        for trigger in triggers:
            await until(taken_back(db, f"discord:{trigger['id']}"), "the purge")
        rows = await db._fetchall(
            "SELECT label, version FROM message_deletions WHERE community_id = ?", (whole,)
        )
        assert len(rows) == len(triggers)
        learned = sorted(label for label, version in rows if version is not None)
        versions = [
            v for v in await db.community(whole).versions(limit=100) if v.cause == "message-deleted"
        ]
        named = sorted(name for v in versions for name in (v.actor or "").split(", "))
        assert learned and named == learned
        assert {version for _, version in rows if version is not None} <= {
            v.version for v in versions
        }
        assert agent.sponge.opinion_vectors == {}
        assert agent.sponge.staged_opinion_updates == []
        # Topics only the purged messages produced (each by several of them, so none
        # is one message's own) are words of theirs too: no version names them now.
        kept = await db.community(whole).versions(limit=100)
        for topic in ("remote_work", "office_culture", OWN_TOPIC):
            assert not [v.version for v in kept if topic in v.change], topic
            assert topic not in agent.sponge.model_dump_json()
        # Each replay has its line in history (what a joint one's says:
        # test_message_deletion.py, where the batch is not left to timing).
        history = await command(world.runtime, "history", community=Community(id=whole))
        replays = [line for line in history.text.splitlines() if "replayed without" in line]
        assert len(replays) == len(versions)
        # Each message's memory (its id is the message's interaction id) was deleted,
        # and deletions finished together deleted theirs together, as each delete saves
        # the index and rebuilds Chroma's file: 2 deletes here (the first message's
        # alone, then the six that waited for it), 7 before `forget_episodes` batched.
        assert len(set().union(*deletes)) >= len(triggers)
        assert len(deletes) < len(triggers), [len(ids) for ids in deletes]


async def test_an_edited_argument_is_judged_again_as_a_new_message(
    tmp_path: Path, llm: AnthropicLLM, anthropic_server: AnthropicFake
) -> None:
    """The edit takes the old words back and answers the new ones, which are learned
    as the newest message: the opinions equal those of a server that heard the other
    messages and then the new words. A preview (no edit) changes nothing."""
    teach(anthropic_server.brain)
    async with two_servers(tmp_path / "data", llm, anthropic_server) as world:
        whole, fresh = World.community(world.guild_a), World.community(world.guild_b)
        played = await play(speaker(world), whole, fresh)
        agent, other = world.agent(world.guild_a), world.agent(world.guild_b)
        trigger = played.deleted
        before = agent.sponge.model_copy(deep=True)

        await world.fake.message_preview(trigger)
        rows = await deletion_rows(world.runtime.db)
        # A barrier: the next gateway event is handled after the preview's.
        await mention(world, world.guild_b, "Anyone?", author=USERS[CHATTER])
        await mention(world, world.guild_a, "Anyone?", author=USERS[CHATTER])
        assert await deletion_rows(world.runtime.db) == rows
        assert len(replies_to(world, trigger)) == 1

        bot = world.fake.bot
        await world.fake.message_edit(trigger, f"<@{bot.id}> {EDITED}", mentions=[bot])
        await world.fake.wait_for(lambda r: r in replies_to(world, trigger), count=2, seconds=WAIT)
        await settle(world)
        await mention(world, world.guild_b, EDITED, author=USERS[ARGUER])

        versions = await world.runtime.db.community(whole).versions(limit=2)
        assert [v.cause for v in versions] == ["interaction", "message-deleted"]
        assert "edited by its author" in versions[1].change
        assert_same_opinions_rebased(agent.sponge, other.sponge)
        assert differs_somewhere(agent.sponge, before)
        assert await tables_holding(world.runtime.db, [WORD]) == []
        [(message,)] = await world.runtime.db._fetchall(
            "SELECT message FROM interactions WHERE message_ref = ?", (f"discord:{trigger['id']}",)
        )
        assert message == EDITED
