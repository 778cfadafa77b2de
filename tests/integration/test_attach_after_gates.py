"""The runtime attaches a message's files (downloads its pictures) only once it has let
the message through: not in an `off` channel, not for a member past the flood limit.
A picture costs up to 3.75 MB of download; a message that gets no answer costs none.
(Through Discord's adapter and its CDN: test_channel_modes_platforms.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.wiring import open_runtime
from bot.messages import IncomingMessage, ReplyKind
from bot.runtime import Runtime
from sonality.llm import ImagePart
from storage.channels import ChannelMode
from tests.fakes.images import picture
from tests.integration.conftest import ALICE, A, make_settings

PNG = ImagePart(media_type="image/png", data=picture("image/png"))


class Attach:
    """What an adapter hands the runtime: adds one picture, and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, message: IncomingMessage) -> IncomingMessage:
        self.calls += 1
        return message.model_copy(update={"images": (PNG,)})


def mention(channel: str, n: int) -> IncomingMessage:
    return IncomingMessage(
        community=A, channel_id=channel, user=ALICE, text=f"look {n}", message_id=f"m{n}"
    )


async def test_an_off_channel_downloads_nothing_and_an_answer_gets_its_picture(
    runtime: Runtime,
) -> None:
    await runtime.channels.set(A.id, "c-off", "quiet", ChannelMode.OFF, ALICE)
    attach = Attach()
    assert await runtime.handle(mention("c-off", 1), attach=attach) is None
    assert attach.calls == 0

    reply = await runtime.handle(mention("c1", 2), attach=attach)
    assert reply is not None and reply.kind is ReplyKind.ANSWER
    assert attach.calls == 1


async def test_a_member_past_the_flood_limit_downloads_nothing(tmp_path: Path, llm: Any) -> None:
    settings = make_settings(tmp_path / "data", SONALITY_RATE_LIMIT_MESSAGES=1)
    async with open_runtime(settings, llm=llm) as runtime:
        attach = Attach()
        first = await runtime.handle(mention("c1", 1), attach=attach)
        assert first is not None and first.kind is ReplyKind.ANSWER
        slowed = await runtime.handle(mention("c1", 2), attach=attach)  # told to slow down
        dropped = await runtime.handle(mention("c1", 3), attach=attach)  # past that: nothing
        assert slowed is not None and slowed.kind is ReplyKind.NOTICE and dropped is None
        assert attach.calls == 1
