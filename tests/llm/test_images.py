"""Images to the model through both real SDKs, and both fakes as strict as the APIs.

What must hold for each provider: a user turn's images arrive as the vendor's own image
content (Anthropic: `image` blocks with a base64 source; OpenAI: `image_url` parts with
data URLs), before the turn's text and only in that turn; a streamed reply carries them
too; and the cached prefix of the conversation is still read from the cache when the
newest turn brings a picture. The fakes refuse what the APIs refuse (a media type that
is not what the bytes are, an image over the size limit, pixels past 8000, an image to a
model that reads none), and the client turns that 400 into `LLMError`.
"""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from sonality.llm import ChatTurn, ImagePart, LLMError, SystemBlock, TextSink
from tests.fakes.anthropic_fixtures import FAKE_API_KEY, client_for
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.images import blank_png, noise_png, picture
from tests.fakes.openai_fixtures import FAKE_OPENAI_KEY, openai_client_for
from tests.fakes.openai_server import OpenAIFake
from tests.llm.conftest import Vendor
from tests.llm.test_streaming import LONG_SYSTEM


def with_images(*images: ImagePart, text: str = "What is in this picture?") -> list[ChatTurn]:
    return [
        ChatTurn(role="user", content="Earlier question."),
        ChatTurn(role="assistant", content="Earlier answer."),
        ChatTurn(role="user", content=text, images=images),
    ]


async def ask(vendor: Vendor, turns: list[ChatTurn], on_text: TextSink | None = None) -> str:
    result = await vendor.client.reply(
        system=[SystemBlock(text="Be brief.")], messages=turns, max_tokens=200, on_text=on_text
    )
    return result.text


async def test_images_arrive_as_the_vendors_own_image_content(vendor: Vendor) -> None:
    png = ImagePart(media_type="image/png", data=picture("image/png"))
    jpeg = ImagePart(media_type="image/jpeg", data=picture("image/jpeg"))
    await ask(vendor, with_images(png, jpeg))
    [request] = vendor.server.requests
    assert request.images == [("image/png", png.data), ("image/jpeg", jpeg.data)]
    last = request.messages[-1]
    assert last["role"] == "user"
    # The pictures first, then the text about them; earlier turns stay plain text.
    if vendor.name == "anthropic":
        kinds = [block["type"] for block in last["content"]]
        assert kinds == ["image", "image", "text"]
        assert last["content"][0]["source"]["type"] == "base64"
        assert last["content"][0]["source"]["media_type"] == "image/png"
    else:
        kinds = [part["type"] for part in last["content"]]
        assert kinds == ["image_url", "image_url", "text"]
        encoded = base64.standard_b64encode(png.data).decode()
        assert last["content"][0]["image_url"]["url"] == f"data:image/png;base64,{encoded}"
    assert last["content"][-1]["text"] == "What is in this picture?"
    assert all(isinstance(m["content"], str) for m in request.messages[:-1])


async def test_a_streamed_reply_carries_the_images_too(vendor: Vendor) -> None:
    gif = ImagePart(media_type="image/gif", data=picture("image/gif"))
    pieces: list[str] = []

    async def sink(piece: str) -> None:
        pieces.append(piece)

    text = await ask(vendor, with_images(gif), on_text=sink)
    [request] = vendor.server.requests
    assert request.body.get("stream") is True
    assert request.images == [("image/gif", gif.data)]
    assert "".join(pieces) == text and text


async def test_the_conversation_before_a_picture_is_still_read_from_the_cache(
    vendor: Vendor,
) -> None:
    """Pictures go in the newest turn only, after the cached prefix: a second question
    with another picture reuses what the first one wrote."""
    history = [
        ChatTurn(role="user", content="Tell me about tides. " * 150),
        ChatTurn(role="assistant", content="Tides follow the moon. " * 150, cache=True),
    ]
    system = [SystemBlock(text=LONG_SYSTEM, cache=True)]
    results = []
    for _ in range(2):
        image = ImagePart(media_type="image/webp", data=picture("image/webp"))
        turns = [*history, ChatTurn(role="user", content="And this?", images=(image,))]
        results.append(await vendor.client.reply(system=system, messages=turns, max_tokens=100))
    assert results[1].usage.cache_read_tokens > 0
    # The second picture is new: it is never among what was read.
    prompt = results[1].usage.input_tokens + results[1].usage.cache_read_tokens
    assert results[1].usage.cache_read_tokens < prompt


async def test_an_image_costs_input_tokens(vendor: Vendor) -> None:
    plain = await vendor.client.reply(
        system=[SystemBlock(text="Be brief.")], messages=with_images(), max_tokens=50
    )
    image = ImagePart(media_type="image/png", data=blank_png(1024, 1024))
    pictured = await vendor.client.reply(
        system=[SystemBlock(text="Be brief.")], messages=with_images(image), max_tokens=50
    )
    assert pictured.usage.input_tokens > plain.usage.input_tokens + 300


async def test_a_media_type_that_is_not_the_bytes_is_refused_by_anthropic() -> None:
    """The bytes are a JPEG, the block says PNG: Anthropic refuses the whole request."""
    async with AnthropicFake(api_key=FAKE_API_KEY) as server:
        client = client_for(server, max_retries=0)
        try:
            wrong = ImagePart(media_type="image/png", data=picture("image/jpeg"))
            with pytest.raises(LLMError, match="does not match the provided media type"):
                await ask(Vendor("anthropic", server, client), with_images(wrong))
        finally:
            await client.aclose()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # 1,200 x 1,200 random pixels: 4.3 MB of file, 5.8 MB of base64.
        (noise_png(1200), "image exceeds 5 MB maximum"),
        (blank_png(8001, 10), "exceed max allowed size: 8000 pixels"),
        (b"<html>not an image</html>", "Could not process image"),
    ],
    ids=["over-5MB-of-base64", "over-8000-pixels", "not-an-image"],
)
async def test_anthropic_refuses_what_its_api_refuses(data: bytes, problem: str) -> None:
    async with AnthropicFake(api_key=FAKE_API_KEY) as server:
        client = client_for(server, max_retries=0)
        try:
            image = ImagePart(media_type="image/png", data=data)
            with pytest.raises(LLMError, match=problem):
                await ask(Vendor("anthropic", server, client), with_images(image))
            assert server.requests and server.requests[0].body["messages"]
        finally:
            await client.aclose()


async def test_openai_refuses_bytes_that_are_no_image_it_reads() -> None:
    async with OpenAIFake(api_key=FAKE_OPENAI_KEY) as server:
        client = openai_client_for(server, max_retries=0)
        try:
            bmp = ImagePart(media_type="image/png", data=b"BM" + bytes(64))
            with pytest.raises(LLMError, match="unsupported image"):
                await ask(Vendor("openai", server, client), with_images(bmp))
        finally:
            await client.aclose()


async def test_an_image_to_a_text_only_model_is_a_400_from_openai() -> None:
    async with OpenAIFake(api_key=FAKE_OPENAI_KEY) as server:
        client = openai_client_for(server, max_retries=0, default_model="llama3.1:8b")
        try:
            image = ImagePart(media_type="image/png", data=picture())
            with pytest.raises(LLMError, match="only supported by certain models"):
                await ask(Vendor("openai", server, client), with_images(image))
            # The same words without the picture are answered.
            assert await ask(Vendor("openai", server, client), with_images())
        finally:
            await client.aclose()


def test_only_a_user_turn_carries_images() -> None:
    image = ImagePart(media_type="image/png", data=picture())
    with pytest.raises(ValidationError, match="only a user turn"):
        ChatTurn(role="assistant", content="Here is a picture.", images=(image,))
    with pytest.raises(ValidationError):
        ImagePart(media_type="image/svg+xml", data=b"<svg/>")  # type: ignore[arg-type]
