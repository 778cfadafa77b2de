"""Real image files for tests: each one different, so a test can tell which arrived.

Made with Pillow (which the fakes also use to check what they receive), from random
pixels: random pixels do not compress, so `noise_png(side)` has a predictable size.
"""

from __future__ import annotations

import io
import os

from PIL import Image

#: Pillow's format name for each media type the vendors take.
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}


def picture(media_type: str = "image/png", side: int = 24) -> bytes:
    """A small image of `media_type`, its pixels random (so every call differs)."""
    image = Image.frombytes("RGB", (side, side), os.urandom(side * side * 3))
    out = io.BytesIO()
    image.save(out, format=FORMATS[media_type])
    return out.getvalue()


def noise_png(side: int) -> bytes:
    """A PNG of `side` x `side` random pixels: about 3 x side² bytes, incompressible."""
    return picture("image/png", side)


def blank_png(width: int, height: int) -> bytes:
    """A single-colour PNG: tiny as a file however many pixels it has."""
    out = io.BytesIO()
    Image.new("L", (width, height), 200).save(out, format="PNG")
    return out.getvalue()
