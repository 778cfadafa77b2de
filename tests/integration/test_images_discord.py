"""Images on Discord, end to end: real discord.py ↔ fake Discord (with its CDN), real
runtime, real anthropic / openai SDK ↔ the fakes that check image blocks as the APIs do.

What a member must see: a picture sent with an @mention reaches the reply model as an
image block (through either vendor), the reply's memory says a picture was shared, and
the picture changes no opinion. With a text-only model the words are answered and the
member told the picture was not read. Files that cannot be used (too large, not an
image, served as a web page, on a host that is not Discord's, the fifth picture and
on, a file whose header would take endless reading) are each named in a short note,
the rest of the message is answered, nothing crashes, and nothing is fetched from
anywhere but Discord's CDN.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.images import NOT_READ
from bot.runtime import Runtime
from providers.openai import OpenAILLM
from sonality.agent import SonalityAgent
from tests.adapters.test_image_fetch import jpeg_of_markers
from tests.fakes.discord_fixtures import restores_discord_endpoints  # noqa: F401
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.fakes.images import noise_png, picture
from tests.integration.conftest import LLMFake, chat_requests, ess_requests
from tests.integration.discord_guild import guild_bot
from tests.integration.test_discord_e2e import WAIT, delivered_to, is_reply_post, settle


@dataclass
class World:
    fake: FakeDiscord
    runtime: Runtime
    llm: LLMFake
    guild: FakeGuild
    member: FakeUser

    @property
    def community(self) -> str:
        return f"discord:{self.guild.id}"

    def agent(self) -> SonalityAgent:
        agent = self.runtime.registry.get(self.community)
        assert agent is not None
        return agent


@contextlib.asynccontextmanager
async def discord_images(
    tmp_path: Path, llm: Any, server: LLMFake, **settings: Any
) -> AsyncIterator[World]:
    member = FakeUser(9001, "alice", "Alice")
    if isinstance(llm, OpenAILLM):  # the fake OpenAI knows only its vendor's models
        settings.setdefault("SONALITY_LLM_PROVIDER", "openai")
    async with guild_bot(tmp_path / "data", llm, [member], **settings) as bot:
        yield World(bot.fake, bot.runtime, server, bot.guild, member)


async def send(
    world: World, text: str, attachments: list[dict[str, Any]]
) -> tuple[dict[str, Any], str]:
    """@mention the bot with `attachments`; the text of its reply, once learning is done."""
    fake = world.fake
    trigger = await fake.message_create(
        channel=world.guild.channels[0],
        author=world.member,
        content=f"<@{fake.bot.id}> {text}".rstrip(),
        mentions=[fake.bot],
        attachments=attachments,
    )
    await fake.wait_for(lambda r: is_reply_post(r, trigger), seconds=WAIT)
    await settle(world)  # type: ignore[arg-type]
    [reply] = delivered_to(world, trigger)  # type: ignore[arg-type]
    return trigger, str(reply["content"])


def attach(world: World, name: str, data: bytes, **options: Any) -> dict[str, Any]:
    return world.fake.attachment(world.guild.channels[0], name, data, **options)


async def turns(world: World) -> Sequence[tuple[str, str]]:
    return await world.runtime.db.recent_turns(
        world.community, str(world.member.id), max_turns=20, max_chars=100_000
    )


async def test_a_picture_reaches_the_reply_model_as_an_image_block(
    tmp_path: Path, llm: Any, llm_server: LLMFake
) -> None:
    async with discord_images(tmp_path, llm, llm_server) as world:
        png = picture("image/png")
        _, reply = await send(world, "what is on this?", [attach(world, "cat.png", png)])
        assert reply.startswith("[reply] what is on this?")
        [chat] = chat_requests(llm_server)
        assert chat.images == [("image/png", png)]
        # Fetched once from the CDN, without the bot token (the CDN takes none).
        [fetch] = world.fake.cdn_requests
        assert "Authorization" not in fetch.headers
        # Learning rated the words alone: no image, no note, in the rating request.
        [ess] = ess_requests(llm_server)
        assert ess.images == [] and "shared" not in ess.user_text
        assert "what is on this?" in ess.user_text
        # What is kept says a picture came, and holds no picture.
        assert (await turns(world))[0] == ("user", "what is on this?\n[shared 1 image]")
        [interaction] = [s.interaction_id for s in await world.agent().store.evidence()]
        [memory] = world.agent().episodes.stored([interaction])
        assert str(memory["document"]).endswith("[shared 1 image]")


async def test_a_picture_alone_never_moves_a_belief(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    """Even if the rating model were taken with pictures (a rule that rates anything
    mentioning one as strong evidence), a picture without words is not rated at all,
    and a picture with weak words is rated on the words."""
    for clue in ("shared", "image", "picture"):
        anthropic_server.brain.ess_rule(
            contains=clue, score=0.95, direction="supports", topics=["pictures"]
        )
    async with discord_images(tmp_path, llm, anthropic_server) as world:
        for text in ("", "", "hi", "", "ok"):  # five messages: past the cooling period
            _, reply = await send(world, text, [attach(world, "p.png", picture())])
            assert reply.startswith("[reply]")
        agent = world.agent()
        assert agent.sponge.interaction_count == 5
        assert agent.sponge.opinion_vectors == {}
        assert agent.sponge.staged_opinion_updates == []
        rated = [r.user_text for r in ess_requests(anthropic_server)]
        assert len(rated) == 2  # "hi" and "ok"; the pictures alone were not rated
        assert all(r.images == [] for r in ess_requests(anthropic_server))
        assert not any(clue in text for text in rated for clue in ("shared", "image"))
        # Every reply still saw its picture.
        assert [len(r.images) for r in chat_requests(anthropic_server)] == [1] * 5


async def test_a_text_only_model_answers_the_words_and_says_the_picture_was_not_read(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    async with discord_images(tmp_path, llm, anthropic_server, SONALITY_VISION="off") as world:
        _, reply = await send(world, "what about this?", [attach(world, "a.png", picture())])
        assert reply.startswith("[reply] what about this?")
        assert reply.endswith(f"({NOT_READ})")
        assert [r.images for r in chat_requests(anthropic_server)] == [[]]
        assert world.fake.cdn_requests == []  # not even downloaded

        # A picture alone: the note, and no model call at all.
        calls = len(anthropic_server.requests)
        _, alone = await send(world, "", [attach(world, "b.png", picture())])
        assert alone == NOT_READ
        assert len(anthropic_server.requests) == calls
        assert world.fake.cdn_requests == []


@pytest.mark.parametrize("llm_server", ["openai"], indirect=True)
async def test_an_unknown_model_counts_as_text_only(
    tmp_path: Path, llm: Any, llm_server: LLMFake
) -> None:
    """`auto` with a model the bot does not know (here a local one): no picture is sent,
    which the fake, like OpenAI-compatible servers, would refuse for that model."""
    async with discord_images(tmp_path, llm, llm_server, SONALITY_MODEL="llama3.1:8b") as world:
        _, reply = await send(world, "see this", [attach(world, "a.png", picture())])
        assert reply.startswith("[reply] see this") and reply.endswith(f"({NOT_READ})")
        assert world.fake.cdn_requests == []


@pytest.mark.parametrize("llm_server", ["openai"], indirect=True)
async def test_vision_on_sends_a_picture_to_any_model(
    tmp_path: Path, llm: Any, llm_server: LLMFake
) -> None:
    """`on` is the operator's word for a model the bot does not know (a local vision
    model): the picture goes, and the server answers."""
    async with discord_images(
        tmp_path, llm, llm_server, SONALITY_MODEL="qwen2.5vl:7b", SONALITY_VISION="on"
    ) as world:
        png = picture()
        await send(world, "and this?", [attach(world, "a.png", png)])
        assert [r.images for r in chat_requests(llm_server)] == [[("image/png", png)]]


async def test_files_that_cannot_be_used_are_named_and_the_rest_answered(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    async with discord_images(tmp_path, llm, anthropic_server) as world:
        good = picture("image/webp")
        files = [
            attach(world, "huge.png", noise_png(1300)),  # 5 MB: over the limit
            attach(world, "notes.pdf", b"%PDF-1.7 ...", content_type="application/pdf"),
            # The upload said PNG; the CDN serves a web page.
            attach(world, "page.png", b"<html></html>", served_type="text/html; charset=utf-8"),
            attach(world, "fine.webp", good, content_type="image/webp"),
        ]
        _, reply = await send(world, "look", files)
        assert reply.startswith("[reply] look")
        assert "huge.png is too large for me to look at" in reply
        assert "notes.pdf is not an image I can look at" in reply
        assert "page.png is not an image I can look at" in reply
        assert [r.images for r in chat_requests(anthropic_server)] == [[("image/webp", good)]]
        fetched = sorted(r.path.rsplit("/", 1)[-1] for r in world.fake.cdn_requests)
        assert fetched == ["fine.webp", "page.png"]  # the size and the label said enough

        # Only files that cannot be used, and no words: a note, and no model call.
        calls = len(anthropic_server.requests)
        _, alone = await send(world, "", [attach(world, "a.pdf", b"%PDF", content_type=None)])
        assert alone == "a.pdf is not an image I can look at (PNG, JPEG, GIF or WebP)."
        assert len(anthropic_server.requests) == calls


async def test_a_file_of_endless_markers_is_named_and_the_rest_answered(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    """A JPEG within the size limit of ~980,000 empty markers before a real 8x8 picture
    (Pillow would walk them one by one, seconds while every community waits) is refused
    unread: a note names it, and the words and the picture beside it are answered."""
    async with discord_images(tmp_path, llm, anthropic_server) as world:
        good = picture("image/png")
        odd = attach(world, "odd.jpg", jpeg_of_markers(), content_type="image/jpeg")
        _, reply = await send(world, "look at these", [odd, attach(world, "fine.png", good)])
        assert reply.startswith("[reply] look at these")
        assert reply.endswith("(I couldn't read odd.jpg, so I answered without it.)")
        assert [r.images for r in chat_requests(anthropic_server)] == [[("image/png", good)]]
        assert (await turns(world))[0] == ("user", "look at these\n[shared 1 image]")


async def test_a_link_to_another_host_is_never_fetched(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    """An attachment pointing anywhere but Discord's CDN (here another fake's CDN, on
    another port of this machine) is not requested; a tampered CDN link is refused."""
    elsewhere = FakeDiscord()
    await elsewhere.start()
    try:
        async with discord_images(tmp_path, llm, anthropic_server) as world:
            foreign = elsewhere.attachment(elsewhere.add_guild("x").channels[0], "a.png", b"x")
            tampered = attach(world, "b.png", picture())
            tampered["url"] = tampered["url"].replace("hm=", "hm=0")
            _, reply = await send(world, "two pictures", [foreign, tampered])
            assert "I couldn't fetch a.png" in reply and "I couldn't fetch b.png" in reply
            assert elsewhere.cdn_requests == []
            assert [r.images for r in chat_requests(anthropic_server)] == [[]]
    finally:
        await elsewhere.close()


async def test_only_the_first_four_pictures_are_used_and_the_member_told(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    async with discord_images(tmp_path, llm, anthropic_server) as world:
        pictures = [picture() for _ in range(6)]
        files = [attach(world, f"p{i}.png", data) for i, data in enumerate(pictures)]
        _, reply = await send(world, "six", files)
        assert reply.endswith("(I looked at the first 4 of your 6 images only.)")
        [chat] = chat_requests(anthropic_server)
        assert [data for _, data in chat.images] == pictures[:4]
        assert len(world.fake.cdn_requests) == 4
        assert (await turns(world))[0] == ("user", "six\n[shared 4 images]")


async def test_no_picture_is_kept_anywhere(
    tmp_path: Path, llm: Any, anthropic_server: LLMFake
) -> None:
    """After the reply and its learning, no file of the bot's data directory (the
    database, its journal, the memories) holds the picture's bytes or their base64."""

    async with discord_images(tmp_path, llm, anthropic_server) as world:
        png = picture("image/png", side=40)
        await send(world, "keep this?", [attach(world, "k.png", png)])
        await world.runtime.drain()
        await asyncio.sleep(0)
    encoded = base64.b64encode(png)
    pieces = [png[len(png) // 2 :][:48], encoded[len(encoded) // 2 :][:48]]
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert not any(p in content for p in pieces), f"{path} holds the picture"
