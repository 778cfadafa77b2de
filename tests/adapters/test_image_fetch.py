"""`bot.images.ImageFetcher` against loopback file hosts: what it fetches, and what not.

The fetcher is the one place the bot downloads something because of a member's
message, so these tests pin its limits with real HTTP (aiohttp, the client it uses):
only the allowed hosts are ever asked, redirects are not followed, a slow or lying host
costs at most the time limit and the size limit, and every refusal is a note for the
member, never an exception. Checking the bytes runs off the event loop, one file at a
time, and a file whose header would take Pillow endless steps is refused unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from PIL import Image

import bot.images
from bot.images import (
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    NOT_READ,
    AttachedFile,
    ImageFetcher,
)
from bot.messages import Community, IncomingMessage, User
from sonality.llm import ImagePart
from tests.fakes.images import blank_png, noise_png, picture

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


# Files within the size limit whose headers are endless: one piece after another (JPEG
# markers, PNG chunks, GIF blocks, stray bytes), each a step of Pillow's walk in Python,
# or chunks Pillow inflates as it opens the file; each ends in a real 8x8 picture.


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _filled(head: bytes, piece: bytes, tail: bytes) -> bytes:
    """`head`, as many `piece`s as the size limit leaves room for, `tail`."""
    return head + piece * ((MAX_IMAGE_BYTES - len(head) - len(tail)) // len(piece)) + tail


def jpeg_of_markers() -> bytes:
    jpeg = picture("image/jpeg", 8)
    return _filled(jpeg[:2], b"\xff\xe1\x00\x02", jpeg[2:])  # empty APP1 segments


def jpeg_of_stray_bytes() -> bytes:
    jpeg = picture("image/jpeg", 8)
    end = 4 + int.from_bytes(jpeg[4:6], "big")  # after the JFIF segment
    return _filled(jpeg[:end], b"\x00", jpeg[end:])


def png_of_text_chunks() -> bytes:
    png = picture("image/png", 8)
    return _filled(png[:33], _chunk(b"tEXt", b"a\x00"), png[33:])  # after IHDR


def png_of_chunks_after_the_pixels() -> bytes:
    png = picture("image/png", 8)  # walked only when the checksums are checked
    return _filled(png[:-12], _chunk(b"zzZz", b""), png[-12:])  # before IEND


def png_of_colour_profiles() -> bytes:
    png = picture("image/png", 8)  # each ~1 KB, inflated to 1 MB as Pillow opens it
    profile = b"p\x00\x00" + zlib.compress(bytes(1024 * 1024 - 1), 9)
    return _filled(png[:33], _chunk(b"iCCP", profile), png[33:])


def gif_of_blocks() -> bytes:
    gif = picture("image/gif", 8)
    palette = 3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0
    at = 13 + palette  # a comment of one-byte blocks before the picture
    return _filled(gif[:at] + b"!\xfe", b"\x01a", b"\x00" + gif[at:])


ENDLESS = {
    "markers.jpg": (jpeg_of_markers, "image/jpeg"),
    "stray.jpg": (jpeg_of_stray_bytes, "image/jpeg"),
    "chunks.png": (png_of_text_chunks, "image/png"),
    "trailer.png": (png_of_chunks_after_the_pixels, "image/png"),
    "profiles.png": (png_of_colour_profiles, "image/png"),
    "blocks.gif": (gif_of_blocks, "image/gif"),
}


@pytest.mark.parametrize("name", ENDLESS)
async def test_a_file_of_endless_pieces_is_refused_and_the_picture_beside_it_used(
    name: str,
) -> None:
    make, kind = ENDLESS[name]
    data, good = make(), picture("image/jpeg")
    assert len(data) <= MAX_IMAGE_BYTES
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        got = await fetcher.attach(
            MESSAGE, [file(host, name, data, kind), file(host, "fine.jpg", good, "image/jpeg")]
        )
    assert [(i.media_type, i.data) for i in got.images] == [("image/jpeg", good)]
    assert got.file_notes == (f"I couldn't read {name}, so I answered without it.",)
    assert got.text == "look"


def png_of_small_chunks(side: int, size: int) -> bytes:
    """A `side`-pixel PNG of random pixels, its compressed pixels cut into `size`-byte
    IDAT chunks (libpng writes 8 KB ones; some writers smaller)."""
    png, pixels, at = noise_png(side), b"", 8
    while at < len(png):
        length = int.from_bytes(png[at : at + 4], "big")
        if png[at + 4 : at + 8] == b"IDAT":
            pixels += png[at + 8 : at + 8 + length]
        at += 12 + length
    head = png[: 8 + 25]  # the signature and IHDR
    cut = b"".join(_chunk(b"IDAT", pixels[i : i + size]) for i in range(0, len(pixels), size))
    return head + cut + _chunk(b"IEND", b"")


def animated_gif(frames: int) -> bytes:
    images = [Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3)) for _ in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "GIF", save_all=True, append_images=images[1:], comment=b"hello")
    return out.getvalue()


def jpeg_with_a_profile() -> bytes:
    """A progressive JPEG with a 300 KB colour profile (five APP2 segments)."""
    image = Image.frombytes("RGB", (800, 600), os.urandom(800 * 600 * 3))
    out = io.BytesIO()
    image.save(out, "JPEG", progressive=True, icc_profile=os.urandom(300_000), quality=50)
    return out.getvalue()


async def test_real_pictures_of_many_pieces_are_still_used() -> None:
    """The bound is far from what real files take: a PNG at the size limit cut into
    1 KB chunks (~3,600 of them), a GIF of 40 frames, a JPEG with a big colour profile."""
    many = png_of_small_chunks(1100, 1024)
    assert len(many) <= MAX_IMAGE_BYTES and many.count(b"IDAT") > 3000
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        got = await fetcher.attach(
            MESSAGE,
            [
                file(host, "many.png", many),
                file(host, "anim.gif", animated_gif(40), "image/gif"),
                file(host, "photo.jpg", jpeg_with_a_profile(), "image/jpeg"),
            ],
        )
    assert [i.media_type for i in got.images] == ["image/png", "image/gif", "image/jpeg"]
    assert got.file_notes == ()


async def test_the_event_loop_runs_on_while_a_file_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checking a file may take Pillow a while; every community's replies and the
    platforms' heartbeats wait on the event loop meanwhile, so the check is not on it.
    Here the check waits for the loop to run a callback: on the loop itself it would
    wait in vain (and give up after 5 s)."""
    loop = asyncio.get_running_loop()
    ticked: list[bool] = []
    check = bot.images._checked

    def checked(data: bytes, name: str) -> ImagePart:
        tick = threading.Event()
        loop.call_soon_threadsafe(tick.set)
        ticked.append(tick.wait(timeout=5))
        return check(data, name)

    monkeypatch.setattr(bot.images, "_checked", checked)
    png = picture()
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        got = await fetcher.attach(MESSAGE, [file(host, "a.png", png)])
    assert ticked == [True]
    assert [i.data for i in got.images] == [png]


async def test_files_are_checked_one_at_a_time_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message's four pictures (and other messages') are checked in turn, in a thread
    of their own, so the memory of checking them never adds up."""
    check = bot.images._checked
    lock, threads = threading.Lock(), set[threading.Thread]()
    running = most = 0

    def checked(data: bytes, name: str) -> ImagePart:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            threads.add(threading.current_thread())
        time.sleep(0.05)  # room for another check to start alongside, were they parallel
        with lock:
            running -= 1
        return check(data, name)

    monkeypatch.setattr(bot.images, "_checked", checked)
    async with file_host() as host:
        fetcher = ImageFetcher([host.url], enabled=True)
        files = [file(host, f"p{i}.png", picture()) for i in range(MAX_IMAGES)]
        got, also = await asyncio.gather(
            fetcher.attach(MESSAGE, files), fetcher.attach(MESSAGE, files[:2])
        )
    assert len(got.images) == MAX_IMAGES and len(also.images) == 2
    assert most == 1
    assert threading.current_thread() not in threads
