"""An update of a message that came with a picture, through the real runtime.

The kept message carries the note `with_image_note` adds ("[shared 1 image]"); the
update the platform reports (Discord's update of an edited message, Slack's
`message_changed` for a link unfurl) carries the words alone. Same words are no edit,
picture or not: nothing is taken back and the adapter does not answer again. Changed
words are an edit: the answer is taken back and the new words are answered anew.
"""

from __future__ import annotations

from bot.messages import IncomingMessage
from bot.runtime import Runtime
from sonality.llm import ImagePart
from tests.fakes.images import picture
from tests.integration.conftest import ALICE, A

PLATFORM = "test"  # the community A is "test:alpha"
TEXT = "What do you make of this chart?"


async def answered_with_picture(runtime: Runtime, message_id: str, text: str) -> list[str]:
    """Answer `text` with one picture as message `message_id`; the ids of what is kept."""
    png = ImagePart(media_type="image/png", data=picture("image/png"))
    message = IncomingMessage(
        community=A, channel_id="c1", user=ALICE, text=text, images=(png,), message_id=message_id
    )
    assert await runtime.handle(message) is not None
    await runtime.drain()
    kept = await runtime.db.member_interaction_ids(A.id, ALICE.id)
    assert kept
    return kept


async def test_the_same_words_of_a_picture_message_are_no_edit(runtime: Runtime) -> None:
    kept = await answered_with_picture(runtime, "m-1", TEXT)
    [(_, message)] = await runtime.db.kept_messages(f"{PLATFORM}:m-1")
    assert message != TEXT  # kept with its image note, which the update does not carry
    assert await runtime.message_edited(PLATFORM, "m-1", TEXT) is False
    assert await runtime.message_edited(PLATFORM, "m-1", f"  {TEXT}\n") is False
    await runtime.drain()
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == kept


async def test_a_picture_alone_updated_without_words_is_no_edit(runtime: Runtime) -> None:
    kept = await answered_with_picture(runtime, "m-2", "")
    assert await runtime.message_edited(PLATFORM, "m-2", "") is False
    await runtime.drain()
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == kept


async def test_changed_words_of_a_picture_message_are_an_edit(runtime: Runtime) -> None:
    await answered_with_picture(runtime, "m-3", TEXT)
    assert await runtime.message_edited(PLATFORM, "m-3", "What about this other chart?") is True
    await runtime.drain()
    assert await runtime.db.member_interaction_ids(A.id, ALICE.id) == []
    assert await runtime.db.kept_messages(f"{PLATFORM}:m-3") == []
