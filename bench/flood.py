"""What the shared flood count adds to each message on PostgreSQL.

Not a figure of the report and not a timed test: a printout for the change's notes.
Timed, per message, on a real PostgreSQL 16 on 127.0.0.1 (pgserver's binaries, as the
tests start it) or on the server at ``--url``:

* the in-process `RateLimiter.check` (what a SQLite bot pays, unchanged);
* `Database.flood_hit` alone (one upsert in autocommit through the pool);
* `SharedRateLimiter.check` as the runtime calls it (the in-process count, a task,
  the upsert, the verdict), one message at a time and 16 at once;
* the same for a member over the limit, whose messages also claim the notice
  (`Database.flood_warn`, a second statement only flooding members pay).

Members are spread over 200 (community, member) pairs so rows are both inserted and
updated, as a busy bot's are.

    .venv/bin/python -m bench.flood [--url postgresql://...] [--messages 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from bot.ratelimit import RateLimiter, SharedRateLimiter
from sonality.store import utcnow
from storage import Database

PAIRS = 200


def _pair(i: int) -> tuple[str, str]:
    return f"slack:T{i % 7}", f"U{i % PAIRS:05d}"


def _summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p50 = statistics.median(ordered) * 1e3
    p95 = ordered[int(len(ordered) * 0.95) - 1] * 1e3
    return f"{name:<44} p50 {p50:7.3f} ms   p95 {p95:7.3f} ms   (n={len(ordered)})"


async def _timed(n: int, one: Callable[[int], Awaitable[object]]) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        await one(i)
        out.append(time.perf_counter() - start)
    return out


async def measure(url: str, messages: int) -> None:
    local = RateLimiter(limit=10**9, window=60.0)
    start = time.perf_counter()
    for i in range(messages):
        local.check(*_pair(i))
    per = (time.perf_counter() - start) / messages
    print(f"{'in-process RateLimiter.check (SQLite path)':<44} mean {per * 1e6:7.2f} us")

    db = await Database.open_url(url)
    try:
        window = local.window
        shared = SharedRateLimiter(db, RateLimiter(limit=10**9, window=window))
        await _timed(200, lambda i: shared.check(*_pair(i)))  # warm the pool and the table
        span = timedelta(seconds=window)
        raw = await _timed(messages, lambda i: db.flood_hit(*_pair(i), utcnow(), span))
        print(_summary("Database.flood_hit (one upsert)", raw))
        full = await _timed(messages, lambda i: shared.check(*_pair(i)))
        print(_summary("SharedRateLimiter.check, one at a time", full))
        flooding = SharedRateLimiter(db, RateLimiter(limit=1, window=window))
        over = await _timed(messages, lambda i: flooding.check("slack:T9", "U0FLOOD"))
        print(_summary("SharedRateLimiter.check, over the limit", over[1:]))
        batch = 16
        start = time.perf_counter()
        for first in range(0, messages, batch):
            await asyncio.gather(
                *(shared.check(*_pair(i)) for i in range(first, min(first + batch, messages)))
            )
        elapsed = time.perf_counter() - start
        print(
            f"{'SharedRateLimiter.check, 16 at once':<44} "
            f"{messages / elapsed:7.0f} checks/s   ({elapsed / messages * 1e3:.3f} ms each)"
        )
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a PostgreSQL database to use (default: a throwaway one)")
    parser.add_argument("--messages", type=int, default=3000)
    options = parser.parse_args()
    if options.url:
        asyncio.run(measure(options.url, options.messages))
        return
    from bench.scale import postgres_server

    with postgres_server("flood") as server:
        asyncio.run(measure(server.new_database(), options.messages))


if __name__ == "__main__":
    main()
