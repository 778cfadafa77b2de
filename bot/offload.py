"""CPU-heavy command work in a worker process, away from the event loop.

Why a process and not a thread: the event loop sends and reads every reply of every
community. A thread doing pure-Python work (rebuilding thousands of stored versions,
drawing a picture) holds the GIL most of the time, and the loop then waits for it at
every wake-up: with ten timelines drawing in threads, another community's reply took
several times as long. In a process of its own the work only takes a core.

One worker: commands that cost seconds queue behind each other instead of taking
every core, so however many run, the bot's own process keeps a core for replies. It
is started when first needed (most bots never draw a timeline, and figure 4 counts
every process's memory) and stopped after `IDLE_SECONDS` without work.

A worker that dies (killed, out of memory) fails the calls it had; the next call starts
a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

log = logging.getLogger(__name__)

A = TypeVar("A")
T = TypeVar("T")

IDLE_SECONDS = 300.0
"""A worker with nothing to do for this long is stopped (started again when needed)."""


def _context(preload: tuple[str, ...]) -> multiprocessing.context.BaseContext:
    """The fork server where there is one (the bot has threads, so never plain fork).

    Its preload (by default the main module: the whole bot) is set to `preload` in
    case this starts it; if it already runs, the worker forks from it as it is."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
        return context
    return multiprocessing.get_context("spawn")


NICENESS = 10
"""How much the worker yields the CPU to the bot's own process (and everything else):
when cores are short, replies go first and the picture waits."""


def _start(preload: tuple[str, ...]) -> None:
    """Runs in the worker as it starts: imports what its calls need at full priority
    (the first call would otherwise wait for them, yielding to everything else), then
    lowers its priority."""
    for module in preload:
        importlib.import_module(module)
    with contextlib.suppress(OSError, AttributeError):  # no os.nice on Windows
        os.nice(NICENESS)


class Worker:
    """Runs picklable functions in one worker process; `await call(fn, arg)`."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS, preload: tuple[str, ...] = ()) -> None:
        self.idle_seconds = idle_seconds
        self.preload = preload  # modules the worker imports as it starts
        self._pool: ProcessPoolExecutor | None = None
        self._busy = 0
        self._idle: asyncio.TimerHandle | None = None
        self.calls = 0  # calls made so far (tests count them)

    @property
    def running(self) -> bool:
        return self._pool is not None

    async def call(self, fn: Callable[[A], T], arg: A) -> T:
        loop = asyncio.get_running_loop()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=_context(self.preload),
                initializer=_start,
                initargs=(self.preload,),
            )
        pool = self._pool
        self._busy += 1
        self.calls += 1
        try:
            return await loop.run_in_executor(pool, fn, arg)
        except BrokenProcessPool:
            log.warning("the command worker process died; the next command starts a new one")
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            self._busy -= 1
            if not self._busy and self._pool is not None:
                self._idle = loop.call_later(self.idle_seconds, self._stop_if_idle)

    def _stop_if_idle(self) -> None:
        self._idle = None
        if self._busy or self._pool is None:
            return
        pool, self._pool = self._pool, None
        pool.shutdown(wait=False)  # idle: it exits at once, nothing to wait for

    async def close(self) -> None:
        """Stop the worker (its current call, if any, is left to finish)."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
