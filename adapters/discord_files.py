"""Files a command answers with, made to fit Discord's attachment limit.

Discord refuses a file over the limit an interaction announces (`attachment_size_limit`:
8 MiB by default, more in boosted servers) with 413 and code 40005, and a refused answer
leaves the member looking at "thinking…" until the interaction expires. A heavy member's
`my-data` export passes that (5,000 messages are about 31 MB of JSON), and JSON zips
to a fraction of its size: a file over the limit goes as a zip of itself, and one that
is still too large is named in the answer instead of sent."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence

import discord

from bot.messages import Attachment


def fit_attachments(
    files: Sequence[Attachment], limit: int
) -> tuple[list[discord.File], list[str]]:
    """The files to send, each at most `limit` bytes, and a sentence for each left out."""
    fitted: list[discord.File] = []
    notes: list[str] = []
    for f in files:
        data, name = f.data, f.name
        if len(data) > limit:
            data, name = _zipped(f), f"{f.name}.zip"
        if len(data) > limit:
            notes.append(
                f"{f.name} is {_mb(len(f.data))}, more than Discord lets me attach here "
                f"({_mb(limit)}), even zipped; it was not sent."
            )
            continue
        fitted.append(
            discord.File(io.BytesIO(data), filename=name, description=f.description or None)
        )
    return fitted, notes


def _zipped(f: Attachment) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f.name, f.data)
    return out.getvalue()


def _mb(size: int) -> str:
    return f"{size / 1_048_576:.1f} MB"
