"""`PacedRebuilds`: the SQLite file's rebuilds after erasures are shared by the erases
waiting for them and paced, so members asking for forget-me in turn cannot keep the one
connection every community uses busy copying the file."""

from __future__ import annotations

import asyncio
import time

from storage.base import REBUILD_PAUSE_FACTOR, PacedRebuilds

TOOK = 0.05  # seconds one rebuild of the fake takes


class Rebuild:
    """A stand-in for the VACUUM call: records when each one started and ended."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, float]] = []
        self.started = asyncio.Event()

    async def __call__(self) -> None:
        started = time.monotonic()
        self.started.set()
        await asyncio.sleep(TOOK)
        self.runs.append((started, time.monotonic()))


async def test_erases_waiting_for_a_rebuild_share_the_next_one() -> None:
    rebuilds, rebuild = PacedRebuilds(), Rebuild()
    first = asyncio.create_task(rebuilds.after_erase(rebuild))
    await rebuild.started.wait()
    # Committed while the first rebuild copies the file: it may not cover them.
    waiting = [asyncio.create_task(rebuilds.after_erase(rebuild)) for _ in range(5)]
    await asyncio.gather(first, *waiting)
    assert len(rebuild.runs) == 2


async def test_the_next_rebuild_waits_three_times_as_long_as_the_last_took() -> None:
    rebuilds, rebuild = PacedRebuilds(), Rebuild()
    await rebuilds.after_erase(rebuild)
    await rebuilds.after_erase(rebuild)  # one erase after another, as a member can
    [(_, ended), (started, _)] = rebuild.runs
    took = rebuild.runs[0][1] - rebuild.runs[0][0]
    assert started - ended >= REBUILD_PAUSE_FACTOR * took * 0.99


async def test_an_erase_returns_only_after_a_rebuild_that_started_after_it() -> None:
    rebuilds, rebuild = PacedRebuilds(), Rebuild()
    committed = time.monotonic()
    await rebuilds.after_erase(rebuild)
    [(started, ended)] = rebuild.runs
    assert committed <= started and ended <= time.monotonic()
