"""Images members attach, fetched for the reply model, and what to tell them otherwise.

The adapters hand over the files a message carries as the platform describes them
(`AttachedFile`); `ImageFetcher.attach` puts the pictures the model may see into the
neutral message, as bytes, and a short note for each file it could not use.

Why so careful with a download:
* Only from the platform's own file hosts (Discord's CDN, Slack's files host, or the
  configured API host where the tests' fakes serve them). A fetch is the bot making a
  request because of a member's message; a URL anywhere else is never requested, so an
  event cannot send the bot to an internal address, and the Slack token a download
  carries goes nowhere but Slack. Redirects are not followed, for the same reason (a
  Slack download with a bad token is answered with a redirect to the login page).
* At most `MAX_IMAGES` a message, each within `MAX_IMAGE_BYTES` and `FETCH_SECONDS`,
  read in pieces and dropped as soon as it is too long, so a huge file costs nothing.
* The bytes are checked, not only the header: the format named to the model's API must
  be the one in the bytes and within its pixel limit, or the vendor refuses the whole
  request and the member gets no answer at all.
* The check runs off the event loop, one file at a time bot-wide, and within a bound of
  work: Pillow walks a file's header in Python, a step per piece (JPEG marker, PNG chunk,
  GIF block), so a file within the size limit made of a million empty pieces would
  otherwise cost seconds of CPU and a hundred MB while every community waits.

Nothing here keeps an image: the bytes live as long as the message is being answered.
"""

from __future__ import annotations

import asyncio
import io
import logging
import mimetypes
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import get_args
from urllib.parse import urlsplit

import aiohttp
from PIL import Image, UnidentifiedImageError

from bot.messages import IncomingMessage
from sonality.llm import ImageMediaType, ImagePart

__all__ = ["MAX_IMAGES", "MAX_IMAGE_BYTES", "AttachedFile", "ImageFetcher", "origin"]

log = logging.getLogger(__name__)

#: The most images of one message that go to the model; the rest are left out (and the
#: member told), so one message cannot make a reply many times dearer.
MAX_IMAGES = 4
#: Anthropic refuses an image whose base64 text passes 5 MB; that is this many bytes of
#: file (base64 writes 3 bytes as 4 characters). OpenAI's limit is higher.
MAX_IMAGE_BYTES = 5 * 1024 * 1024 * 3 // 4
#: The most pixels on either side the vendors take (Anthropic's 8000).
MAX_IMAGE_SIDE = 8000
#: The longest one file's download may take, from request to last byte.
FETCH_SECONDS = 15.0
_CHUNK = 64 * 1024
#: The most reads Pillow may make of one file while checking it. Its header walk reads
#: once or a few times per piece (a JPEG marker, a PNG chunk, a GIF block, a stray byte
#: between them): a real picture takes tens of reads, a PNG cut into 1 KB chunks about
#: 11,000; a file of 980,000 empty markers would take millions (seconds, ~130 MB).
_MAX_READS = 20_000
#: The most PNG chunks before the pixels that Pillow inflates as it opens the file (a
#: colour profile, compressed text; up to 1 MB each): a real picture has a few.
_MAX_PACKED_CHUNKS = 16
_PACKED_CHUNKS = frozenset({b"iCCP", b"zTXt", b"iTXt"})
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

IMAGE_TYPES: frozenset[str] = frozenset(get_args(ImageMediaType))
#: Pillow's name of each format the vendors take.
_FORMATS: dict[str, ImageMediaType] = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
}

NOT_READ = "I can't see images with the language model I run on; only your words reach me."


def _shown_name(name: str) -> str:
    """A file name fit to repeat to the member: no markup, no mentions, short."""
    cleaned = re.sub(r"[^\w.\- ()]", "", name).strip()[:60]
    return cleaned or "an attached file"


def _not_an_image(name: str) -> str:
    return f"{_shown_name(name)} is not an image I can look at (PNG, JPEG, GIF or WebP)."


def _too_large(name: str) -> str:
    return (
        f"{_shown_name(name)} is too large for me to look at (at most "
        f"{MAX_IMAGE_BYTES / 1024 / 1024:.2f} MB and {MAX_IMAGE_SIDE} pixels a side)."
    )


def _not_fetched(name: str) -> str:
    return f"I couldn't fetch {_shown_name(name)}, so I answered without it."


def _not_readable(name: str) -> str:
    return f"I couldn't read {_shown_name(name)}, so I answered without it."


def _too_many(count: int) -> str:
    return f"I looked at the first {MAX_IMAGES} of your {count} images only."


@dataclass(frozen=True)
class AttachedFile:
    """A file on a message, as the platform's event describes it (nothing fetched)."""

    name: str
    url: str
    size: int | None = None  # bytes, as the platform says
    media_type: str | None = None  # as the platform labels it

    @property
    def labelled_image(self) -> bool:
        """Whether the platform's label (or, without one, the name) says it is one of
        the image formats the model takes."""
        label = self.media_type or mimetypes.guess_type(self.name)[0] or ""
        return _main_type(label) in IMAGE_TYPES


def _main_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, the default port filled in; None else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


class _Refused(Exception):
    """One file not used; `note` is what the member is told, the message what is logged."""

    def __init__(self, note: str, why: str) -> None:
        super().__init__(why)
        self.note = note


class ImageFetcher:
    """Fetches a message's images from `hosts` (URLs whose scheme, host and port are
    the only ones ever requested). `enabled` False: the reply model reads no images,
    so none is fetched and the member is told so once."""

    def __init__(
        self,
        hosts: Iterable[str],
        *,
        enabled: bool,
        timeout: float = FETCH_SECONDS,
        platform: str = "",
    ) -> None:
        self.hosts = frozenset(o for o in (origin(h) for h in hosts) if o is not None)
        self.enabled = enabled
        self.timeout = timeout
        self.platform = platform or "the platform"

    async def attach(
        self,
        message: IncomingMessage,
        files: Sequence[AttachedFile],
        headers: Mapping[str, str] | None = None,
    ) -> IncomingMessage:
        """`message` with the images among `files` and a note for every file left out.
        Never raises for a file: a failed one is a note and a log line."""
        if not files:
            return message
        images = [f for f in files if f.labelled_image]
        notes = [_not_an_image(f.name) for f in files if not f.labelled_image]
        parts: list[ImagePart] = []
        if images and not self.enabled:
            notes.append(NOT_READ)
        elif images:
            if len(images) > MAX_IMAGES:
                notes.append(_too_many(len(images)))
            fetched = await asyncio.gather(
                *(self._fetch(index, f, headers) for index, f in enumerate(images[:MAX_IMAGES]))
            )
            for got in fetched:
                if isinstance(got, ImagePart):
                    parts.append(got)
                else:
                    notes.append(got)
        return message.model_copy(
            update={
                "images": (*message.images, *parts),
                "file_notes": (*message.file_notes, *notes),
            }
        )

    async def _fetch(
        self, index: int, file: AttachedFile, headers: Mapping[str, str] | None
    ) -> ImagePart | str:
        """The file as an image for the model, or the note saying why not."""
        try:
            return await self._download(file, headers)
        except _Refused as refused:
            # Type, size and host only: a file's name and link are the member's.
            log.info(
                "%s image %d (%s, %s bytes) not used: %s",
                self.platform,
                index + 1,
                file.media_type or "no type",
                file.size if file.size is not None else "unknown",
                refused,
            )
            return refused.note
        except Exception:  # a fault of ours: the member still gets the rest answered
            log.exception("%s image %d could not be fetched", self.platform, index + 1)
            return _not_fetched(file.name)

    async def _download(self, file: AttachedFile, headers: Mapping[str, str] | None) -> ImagePart:
        if file.size is not None and file.size > MAX_IMAGE_BYTES:
            raise _Refused(_too_large(file.name), f"the platform says {file.size} bytes")
        where = origin(file.url)
        if where is None or where not in self.hosts:
            host = where[1] if where is not None else "no http(s) host"
            raise _Refused(_not_fetched(file.name), f"{host} is not a file host of it")
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(file.url, headers=dict(headers or {}), allow_redirects=False) as resp,
            ):
                if resp.status != 200:
                    raise _Refused(_not_fetched(file.name), f"the file host answered {resp.status}")
                served = _main_type(resp.headers.get("Content-Type", ""))
                if served not in IMAGE_TYPES:
                    raise _Refused(_not_an_image(file.name), f"it was served as {served!r}")
                if resp.content_length is not None and resp.content_length > MAX_IMAGE_BYTES:
                    raise _Refused(_too_large(file.name), f"{resp.content_length} bytes served")
                data = bytearray()
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    data += chunk
                    if len(data) > MAX_IMAGE_BYTES:
                        raise _Refused(_too_large(file.name), "longer than the limit")
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = f"download failed: {type(exc).__name__}"
            raise _Refused(_not_fetched(file.name), why) from None
        # Off the event loop (every community's replies and the platforms' heartbeats
        # wait on it), in the one checking thread: one file's check in memory at a time.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_CHECKER, _checked, bytes(data), file.name)


#: The thread files are checked in, one at a time for the whole bot (every fetcher,
#: every message), so their memory never adds up.
_CHECKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-check")


class _Intricate(Exception):
    """The file takes more reads than `_MAX_READS` to check."""


class _Budgeted(io.BytesIO):
    """The file's bytes, refusing to be read more than `_MAX_READS` times: Pillow's
    walk of any format reads at least once per step, so this bounds its work, exactly
    as Pillow walks (the file is never parsed twice by two readers that could differ)."""

    reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        if self.reads > _MAX_READS:
            raise _Intricate
        return super().read(size)


def _packed_chunks(data: bytes) -> int:
    """How many chunks a PNG has, before its pixels, that Pillow inflates on opening
    (0 for any other file). Counted from the chunk headers, so nothing is inflated; the
    count stops where Pillow's reads would run out (two a chunk) or past the limit."""
    packed, at = 0, len(_PNG_SIGNATURE)
    if not data.startswith(_PNG_SIGNATURE):
        return packed
    for _ in range(_MAX_READS // 2):
        kind = data[at + 4 : at + 8]
        if kind == b"IDAT" or len(kind) < 4 or packed > _MAX_PACKED_CHUNKS:
            break
        packed += kind in _PACKED_CHUNKS
        at += 12 + int.from_bytes(data[at : at + 4], "big")
    return packed


def _checked(data: bytes, name: str) -> ImagePart:
    """The bytes as an image of the format they really are, within the pixel limit.

    Pillow reads the header and checks the structure without decoding the pixels, so a
    "decompression bomb" costs nothing and is refused by its size. Blocking (up to some
    tens of milliseconds for the most intricate file let through): run it in `_CHECKER`."""
    if _packed_chunks(data) > _MAX_PACKED_CHUNKS:
        raise _Refused(_not_readable(name), "more compressed PNG chunks than a picture has")
    source = _Budgeted(data)
    try:
        # Limited to the formats the vendors take, so no other format's reader runs.
        with Image.open(source, formats=list(_FORMATS)) as image:
            kind, (width, height) = image.format, image.size
            image.verify()  # a PNG's chunk checksums: a cut-off file fails here
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Either is far past MAX_IMAGE_SIDE. (The warning is raised only where warnings
        # are errors; elsewhere it is shown once and the side refuses the file below.
        # Not silenced here: the warning filters are the process's, not this thread's.)
        raise _Refused(_too_large(name), "more pixels than Pillow's bomb limit") from None
    except _Intricate:
        raise _Refused(_not_readable(name), f"more than {_MAX_READS} reads to check") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        if source.reads > _MAX_READS:  # a reader of Pillow's that took it for a bad file
            raise _Refused(_not_readable(name), f"more than {_MAX_READS} reads") from None
        raise _Refused(_not_an_image(name), "its bytes are no image Pillow knows") from None
    if source.reads > _MAX_READS:  # a reader of Pillow's that went on regardless
        raise _Refused(_not_readable(name), f"more than {_MAX_READS} reads to check")
    media_type = _FORMATS.get(kind or "")
    if media_type is None:
        raise _Refused(_not_an_image(name), f"its bytes are {kind}")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise _Refused(_too_large(name), f"{width}x{height} pixels")
    return ImagePart(media_type=media_type, data=data)
