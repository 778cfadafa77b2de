"""A message taken back while the runtime is still getting ready to answer it: its
pictures downloading (up to 15 s a file), its agent loading. The runtime counts it as
being answered from the moment it lets it through, so an edit takes the old words back
and the new ones are answered, and a deletion or the author's forget-me leaves nothing
of it kept or learned, as when they arrive during the model call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from bot.messages import IncomingMessage
from bot.runtime import Runtime
from sonality.llm import ImagePart
from tests.fakes.images import picture
from tests.integration.conftest import ALICE, A, command

PLATFORM = "test"  # the community A is "test:alpha"
OLD = "What do you make of this chart? My password is hunter2"
NEW = "What do you make of this chart?"


async def while_downloading(
    runtime: Runtime, message_id: str, meanwhile: Callable[[], Awaitable[Any]]
) -> Any:
    """Alice's message with a picture; `meanwhile()` runs while the picture downloads.
    Returns what `meanwhile` returned, once the answer is done and learning settled."""
    downloading, release = asyncio.Event(), asyncio.Event()

    async def attach(message: IncomingMessage) -> IncomingMessage:
        downloading.set()
        await release.wait()
        png = ImagePart(media_type="image/png", data=picture("image/png"))
        return message.model_copy(update={"images": (png,)})

    message = IncomingMessage(
        community=A, channel_id="c1", user=ALICE, text=OLD, message_id=message_id
    )
    answering = asyncio.create_task(runtime.handle(message, attach=attach))
    await asyncio.wait_for(downloading.wait(), 10)
    result = await meanwhile()
    release.set()
    await answering
    await runtime.drain()
    return result


async def kept_words(runtime: Runtime, message_id: str) -> list[str]:
    return [text for _, text in await runtime.db.kept_messages(f"{PLATFORM}:{message_id}")]


async def test_an_edit_while_the_pictures_download_takes_the_old_words_back(
    runtime: Runtime,
) -> None:
    anew = await while_downloading(
        runtime, "m-1", lambda: runtime.message_edited(PLATFORM, "m-1", NEW)
    )
    assert anew is True  # the adapter answers the new words
    assert not [t for t in await kept_words(runtime, "m-1") if "hunter2" in t]


async def test_a_deletion_while_the_pictures_download_leaves_nothing(runtime: Runtime) -> None:
    await while_downloading(runtime, "m-2", lambda: runtime.message_deleted(PLATFORM, "m-2", A.id))
    assert await kept_words(runtime, "m-2") == []
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []


async def test_forget_me_while_the_pictures_download_leaves_nothing(runtime: Runtime) -> None:
    done = await while_downloading(
        runtime, "m-3", lambda: command(runtime, "forget-me", "confirm", moderator=False)
    )
    assert done.ok
    assert await kept_words(runtime, "m-3") == []
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []
