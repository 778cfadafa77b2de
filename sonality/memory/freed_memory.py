"""Keep the process's freed memory out of Chroma's index files.

Chroma's HNSW index takes its vector buffer from `malloc` at the collection's capacity
and saves the whole buffer to `data_level0.bin`, the slots no memory fills yet included.
`malloc` does not clear what it hands out, so in a process that has run for a while
those slots hold whatever an earlier, freed allocation held: a member's picture, another
community's message, a request carrying an API key. A test saw a picture's bytes in a
community's index file after the bot had answered it (tests/integration/
test_images_discord.py), and tests/memory/test_freed_memory.py shows the mechanism.

glibc can overwrite memory as it is freed and hand out allocations filled with a known
byte: allocations come out as zeros, as fresh pages would, and freed memory is
overwritten with 0xff. Two switches, because glibc's per-thread cache of small chunks
(up to 1 KiB) skips that step, and Chroma's `length.bin` is such a chunk for a young
collection (a test saw a memory's text in it):
- `restart_scrubbed` (the entry points of `app`, `bench` and `evaluate`; scripts/test.py
  gives pytest the same environment) starts the process again under glibc settings
  (`GLIBC_TUNABLES`) that turn on the scrubbing and turn off that cache. Settings a
  process is started with are the only way to reach the cache.
- `scrub_freed_memory` (whatever opens an embedded Chroma) turns the scrubbing on at run
  time (`mallopt(M_PERTURB)`), so a program that only imports the engine keeps at least
  the large buffers clean.
The price is a `memset` per allocation and free: docs/performance.md.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: glibc's `mallopt` parameter for perturbing allocated and freed memory (malloc.h).
M_PERTURB = -6
#: Freed memory is filled with this byte; allocations with its complement, 0x00.
SCRUB_BYTE = 0xFF

#: What `restart_scrubbed` adds to `GLIBC_TUNABLES` (glibc's manual, "Memory Allocation
#: Tunables"): no per-thread cache of small chunks, and the scrubbing byte.
SCRUBBING_TUNABLES = (
    "glibc.malloc.tcache_count=0",
    f"glibc.malloc.perturb={SCRUB_BYTE}",
)

_lock = threading.Lock()
_scrubbing: bool | None = None


def scrub_freed_memory() -> bool:
    """Turn on glibc's scrubbing of freed and allocated memory, once per process.

    True when it is on. Elsewhere (macOS, musl) it stays off and one warning says so:
    Chroma's index files may then carry bytes of freed memory.
    """
    global _scrubbing
    with _lock:
        if _scrubbing is None:
            _scrubbing = _turn_on()
        return _scrubbing


def _turn_on() -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is not None and mallopt(M_PERTURB, SCRUB_BYTE) == 1:
        log.debug("freed memory is scrubbed (mallopt M_PERTURB)")
        return True
    log.warning(
        "this C library cannot scrub freed memory (no glibc mallopt M_PERTURB): "
        "Chroma's index files may hold bytes of memory the bot has freed"
    )
    return False


def scrubbing_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with `SCRUBBING_TUNABLES` added to the `GLIBC_TUNABLES` it has."""
    kept = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
    names = {t.split("=", 1)[0] for t in SCRUBBING_TUNABLES}
    tunables = [t for t in kept if t.split("=", 1)[0] not in names] + list(SCRUBBING_TUNABLES)
    return {**environ, "GLIBC_TUNABLES": ":".join(tunables)}


def runs_scrubbed(environ: Mapping[str, str]) -> bool:
    """Whether a process started with `environ` runs under `SCRUBBING_TUNABLES`."""
    return environ.get("GLIBC_TUNABLES") == scrubbing_environment(environ)["GLIBC_TUNABLES"]


def restart_scrubbed() -> None:
    """Start this command again under `SCRUBBING_TUNABLES`, unless it runs under them.

    Only on glibc (elsewhere the tunables mean nothing), and once: the new process
    finds them set. Called before the program loads its modules, so the restart costs
    an interpreter start-up, not a bot's.
    """
    if platform.libc_ver()[0] != "glibc" or not sys.executable or runs_scrubbed(os.environ):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, scrubbing_environment(os.environ))
