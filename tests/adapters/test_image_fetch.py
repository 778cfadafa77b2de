"""`bot.images.ImageFetcher` against loopback file hosts: what it fetches, and what not.

The fetcher is the one place the bot downloads something because of a member's
message, so these tests pin its limits with real HTTP (aiohttp, the client it uses):
only the allowed hosts are ever asked, redirects are not followed, a slow or lying host
costs at most the time limit and the size limit, and every refusal is a note for the
member, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from bot.images import (
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    NOT_READ,
    AttachedFile,
    ImageFetcher,
)
from bot.messages import Community, IncomingMessage, User
from tests.fakes.images import blank_png, picture

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class FileHost:
    """A loopback host serving `files` (path -> (bytes, Content-Type)), recording paths."""

    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    handler: Handler | None = None
    url: str = ""

    async def serve(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        if self.handler is not None:
            return await self.handler(request)
        data, kind = self.files[request.path]
        return web.Response(body=data, headers={"Content-Type": kind})


@contextlib.asynccontextmanager
async def file_host() -> AsyncIterator[FileHost]:
    host = FileHost()
    app = web.Application()
    app.router.add_get("/{tail:.*}", host.serve)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield host
    finally:
        await runner.cleanup()


MESSAGE = IncomingMessage(
    community=Community(id="test:c"), channel_id="c1", user=User(id="u1"), text="look"
)


def file(host: FileHost, name: str, data: bytes, kind: str = "image/png") -> AttachedFile:
    path = f"/files/{len(host.files)}/{name}"
    host.files[path] = (data, kind)
    return AttachedFile(name=name, url=host.url + path, size=len(data), media_type=kind)


async def test_an_image_is_fetched_and_named_by_what_its_bytes_are() -> None:
    async with file_host() as host:
        png, jpeg = picture("image/png"), picture("image/jpeg")
        fetcher = ImageFetcher([host.url], enabled=True)
        # The second file is labelled and served as a PNG, but its bytes are a JPEG.
        files = [file(host, "a.png", png), file(host, "b.png", jpeg)]
        got = await fetcher.attach(MESSAGE, files)
    assert [(i.media_type, i.data) for i in got.images] == [
        ("image/png", png),
        ("image/jpeg", jpeg),
    ]
    assert got.file_notes == () and got.text == "look"


async def test_a_host_that_is_not_the_platforms_is_never_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bot.images")
    async with file_host() as allowed, file_host() as foreign:
        fetcher = ImageFetcher([allowed.url], enabled=True, platform="Discord")
        # Same address, other port: another origin.
        got = await fetcher.attach(MESSAGE, [file(foreign, "cat.png", picture())])
        also = await fetcher.attach(
            MESSAGE, [AttachedFile("x.png", "file:///etc/passwd", 10, "image/png")]
        )
    assert foreign.requests == [] and got.images == ()
    assert got.file_notes == ("I couldn't fetch cat.png, so I answered without it.",)
    assert also.images == () and len(also.file_notes) == 1
    # The log says why, with the host and never the member's file name.
    lines = [r.getMessage() for r in caplog.records]
    assert any("127.0.0.1 is not a file host" in line for line in lines), lines
    assert not any("cat.png" in line for line in lines)


async def test_a_redirect_is_not_followed() -> None:
    async with file_host() as allowed, file_host() as elsewhere:
        target = file(elsewhere, "cat.png", picture())

        async def redirect(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(target.url)

        allowed.handler = redirect
        fetcher = ImageFetcher([allowed.url], enabled=True)
        got = await fetcher.attach(
            MESSAGE, [AttachedFile("cat.png", allowed.url + "/cat.png", 100, "image/png")]
        )
    assert len(allowed.requests) == 1 and elsewhere.requests == []
    assert got.images == () and "couldn't fetch" in got.file_notes[0]


async def test_a_slow_host_costs_the_time_limit_and_no_more() -> None:
    async with file_host() as host:

        async def stall(request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(5)
            return web.Response(body=picture(), content_type="image/png")

        host.handler = stall
        fetcher = ImageFetcher([host.url], enabled=True, timeout=0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await fetcher.attach(
            MESSAGE, [AttachedFile("slow.png", host.url + "/slow.png", 100, "image/png")]
        )
        took = loop.time() - started
    assert took < 2.0
    assert got.images == () and "couldn't fetch slow.png" in got.file_notes[0]


async def test_a_host_that_sends_more_than_it_said_is_cut_off_at_the_limit() -> None:
    """The platform said 100 bytes; the host streams on without a Content-Length."""
    async with file_host() as host:
        sent: list[int] = []

        async def endless(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "image/png"})
            await response.prepare(request)
            chunk = b"\x89PNG" + bytes(64 * 1024)
            with contextlib.suppress(ConnectionError):
                for _ in range(200):  # 13 MB if nobody stops reading
                    await response.write(chunk)
                    sent.append(len(chunk))
            return response

        host.handler = endless
        fetcher = ImageFetcher([host.url], enabled=True)
        got = await fetcher.attach(
            MESSAGE, [AttachedFile("big.png", host.url + "/big.png", 100, "image/png")]
        )
    assert got.images == () and "too large" in got.file_notes[0]
    assert sum(sent) < 3 * MAX_IMAGE_BYTES


async def test_files_that_are_no_image_are_refused_with_a_note() -> None:
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        files = [
            file(host, "report.pdf", b"%PDF-1.7", "application/pdf"),  # by its label
            file(host, "page.png", b"<html></html>", "image/png"),  # by its bytes
            # Labelled a PNG by the platform, served as a web page (a sign-in page).
            AttachedFile("login.png", host.url + "/login", 100, "image/png"),
            file(host, "huge.png", blank_png(8001, 10)),  # by its pixels
        ]
        host.files["/login"] = (b"<!DOCTYPE html>", "text/html; charset=utf-8")
        got = await fetcher.attach(MESSAGE, files)
    assert got.images == ()
    assert got.file_notes == (
        "report.pdf is not an image I can look at (PNG, JPEG, GIF or WebP).",
        "page.png is not an image I can look at (PNG, JPEG, GIF or WebP).",
        "login.png is not an image I can look at (PNG, JPEG, GIF or WebP).",
        "huge.png is too large for me to look at (at most 3.75 MB and 8000 pixels a side).",
    )
    assert "/files/0/report.pdf" not in host.requests  # never fetched: its label said so


async def test_a_file_the_platform_says_is_too_large_is_not_fetched() -> None:
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        big = AttachedFile("big.png", host.url + "/big.png", MAX_IMAGE_BYTES + 1, "image/png")
        got = await fetcher.attach(MESSAGE, [big])
    assert host.requests == [] and "too large" in got.file_notes[0]


async def test_only_the_first_images_are_fetched_and_the_member_told() -> None:
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        files = [file(host, f"p{i}.png", picture()) for i in range(MAX_IMAGES + 2)]
        got = await fetcher.attach(MESSAGE, files)
    assert [i.data for i in got.images] == [host.files[f"/files/{i}/p{i}.png"][0] for i in range(4)]
    assert len(host.requests) == MAX_IMAGES
    assert got.file_notes == ("I looked at the first 4 of your 6 images only.",)


async def test_without_a_vision_model_nothing_is_fetched() -> None:
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=False)
        got = await fetcher.attach(MESSAGE, [file(host, "a.png", picture())] * 2)
    assert host.requests == [] and got.images == ()
    assert got.file_notes == (NOT_READ,)  # once, however many images


async def test_a_name_is_repeated_without_markup() -> None:
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        odd = AttachedFile("<@U1> **x**`.pdf", host.url + "/x", 10, "application/pdf")
        got = await fetcher.attach(MESSAGE, [odd])
    assert got.file_notes == ("U1 x.pdf is not an image I can look at (PNG, JPEG, GIF or WebP).",)
