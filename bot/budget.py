"""Daily spending limits per community: a ledger of today's spend, and an LLM client
that refuses to call the model once a community has spent its limit.

Why a ledger in memory and not a database query per call: the check runs before every
LLM call, and learning writes its calls' tokens to the database only when it commits,
seconds after the calls were paid for. The ledger counts each call the moment it
returns, so a burst of messages cannot slip past the limit while its usage waits to be
committed. It starts from the database's figure for today the first time a community
is seen (so a restart forgets nothing) and starts again from zero at local midnight
in SONALITY_TIMEZONE.

With several processes on one PostgreSQL database each keeps its own ledger, so each
also looks at the database's figure for today every `SHARED_SYNC_SECONDS` and takes it
when it is higher (the other processes' calls, once stored), and reads the community's
limit again (a moderator may have changed it in another process). A community can then
go over its limit by what the other processes spent in that window and what their
learning has not committed yet.

Calls already in flight when the limit is reached still finish and are counted, so a
community can end its day slightly over its limit (by at most the calls it had
running at that moment); after that no call is made until midnight.

The engine never sees any of this: `MeteredLLM` is an `LLMClient` like any other, and
a refused call is an `LLMError` (`BudgetExceeded`) whose `retry_after` says when the
day ends, so learning that was refused waits and resumes in order.
"""

from __future__ import annotations

import asyncio
import logging
import time as time_module
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Literal
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict

from bot.messages import is_dm
from bot.settings import Settings
from providers.forwarding import ForwardingLLM
from providers.pricing import ModelPrice, cost_usd
from sonality.llm import (
    LLMClient,
    LLMError,
    R,
    TextResult,
    ToolResult,
    Usage,
)
from sonality.store import utcnow
from storage import Database

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

WARN_AT = 0.8
"""Share of the daily limit at which moderators are warned (log line, status line)."""


class BudgetExceeded(LLMError):
    """The community has spent its daily limit; no LLM call until its local midnight."""

    def __init__(
        self, community_id: str, spent_usd: float, limit_usd: float, retry_after: float
    ) -> None:
        super().__init__(
            f"{community_id} reached its daily spending limit "
            f"({format_usd(spent_usd)} of {format_usd(limit_usd)})",
            retry_after=retry_after,
        )
        self.community_id = community_id
        self.spent_usd = spent_usd
        self.limit_usd = limit_usd


class SpendLimit(BaseModel):
    """A community's daily limit and where it comes from.

    `source`: "default" (SONALITY_DAILY_BUDGET_USD, which may be unset) or "community"
    (a moderator's `/sonality budget`, which may be "off").
    """

    model_config = ConfigDict(frozen=True)

    usd: float | None
    source: Literal["default", "community"]


class BudgetStatus(BaseModel):
    """Today's spend of one community against its limit, for status and commands."""

    model_config = ConfigDict(frozen=True)

    day: date
    spent_usd: float
    usage: Usage
    limit: SpendLimit
    refused_calls: int = 0

    @property
    def exhausted(self) -> bool:
        return self.limit.usd is not None and self.spent_usd >= self.limit.usd

    @property
    def near_limit(self) -> bool:
        """At or past WARN_AT of a set limit."""
        return self.limit.usd is not None and self.spent_usd >= WARN_AT * self.limit.usd


SHARED_SYNC_SECONDS = 5.0
"""With a shared database: how often a community's ledger takes in the stored figures."""


@dataclass
class _Day:
    """One community's running figures for one local day."""

    day: date
    spent_usd: float = 0.0
    usage: Usage = field(default_factory=Usage)
    synced_at: float = field(default_factory=time_module.monotonic)
    warned: bool = False
    reached: bool = False  # "limit reached" logged (once a day and limit)
    refused_calls: int = 0
    # Members already told today that the limit is reached (each is told once).
    noticed: set[str] = field(default_factory=set)


class BudgetLedger:
    """Today's spend per community, the limits, and the one-notice-per-day bookkeeping.

    `clock` returns the current time (aware); tests move it across midnight.
    """

    def __init__(
        self,
        db: Database,
        *,
        default_limit_usd: float | None,
        prices: Mapping[str, ModelPrice] | None = None,
        timezone: str | tzinfo = "UTC",
        clock: Clock = utcnow,
        dm_moderation: bool = False,
    ) -> None:
        self.db = db
        self.default_limit_usd = default_limit_usd
        # Off: a DM personality's own limit (set before DMs lost their moderator) is
        # ignored, so SONALITY_DAILY_BUDGET_USD binds every DM.
        self.dm_moderation = dm_moderation
        self.prices: Mapping[str, ModelPrice] = prices or {}
        self.tz = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
        self.clock = clock
        self._days: dict[str, _Day] = {}
        self._limits: dict[str, SpendLimit] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        # Communities whose day ended since the scheduler last asked (`roll_over`).
        self._rolled: set[str] = set()

    @classmethod
    def from_settings(cls, db: Database, settings: Settings, clock: Clock = utcnow) -> BudgetLedger:
        return cls(
            db,
            default_limit_usd=settings.daily_budget_usd,
            prices=settings.prices,
            timezone=settings.timezone,
            clock=clock,
            dm_moderation=settings.dm_moderation,
        )

    # ------------------------------------------------------------------ time
    def today(self) -> date:
        return self._now().astimezone(self.tz).date()

    def seconds_until_midnight(self) -> float:
        """Seconds until the next local midnight, when every community's day starts anew."""
        now = self._now()
        tomorrow = now.astimezone(self.tz).date() + timedelta(days=1)
        midnight = datetime.combine(tomorrow, time(0), tzinfo=self.tz)
        return max(0.0, (midnight - now).total_seconds())

    def _now(self) -> datetime:
        now = self.clock()
        return now if now.tzinfo is not None else now.replace(tzinfo=UTC)

    # ------------------------------------------------------------------ limits
    async def limit(self, community_id: str) -> SpendLimit:
        cached = self._limits.get(community_id)
        if cached is None:
            override = await self.db.budget_override(community_id)
            if override is None or (is_dm(community_id) and not self.dm_moderation):
                cached = SpendLimit(usd=self.default_limit_usd, source="default")
            else:
                cached = SpendLimit(usd=override.daily_limit_usd, source="community")
            self._limits[community_id] = cached
        return cached

    async def set_limit(self, community_id: str, usd: float | None, *, set_by: str) -> SpendLimit:
        """Give the community its own limit (None: no limit, whatever the default)."""
        await self.db.set_budget_override(community_id, usd, set_by=set_by, at=self._now())
        limit = SpendLimit(usd=usd, source="community")
        self._limits[community_id] = limit
        self._rearm_warning(community_id)
        return limit

    async def follow_default(self, community_id: str) -> SpendLimit:
        """Drop the community's own limit: SONALITY_DAILY_BUDGET_USD applies again."""
        await self.db.clear_budget_override(community_id)
        limit = SpendLimit(usd=self.default_limit_usd, source="default")
        self._limits[community_id] = limit
        self._rearm_warning(community_id)
        return limit

    def _rearm_warning(self, community_id: str) -> None:
        """A new limit deserves its own 80% warning, and members their notice."""
        entry = self._days.get(community_id)
        if entry is not None:
            entry.warned = False
            entry.reached = False
            entry.noticed.clear()

    # ------------------------------------------------------------------ spend
    async def status(self, community_id: str) -> BudgetStatus:
        return await self._status(community_id, await self._entry(community_id))

    async def _status(self, community_id: str, entry: _Day) -> BudgetStatus:
        return BudgetStatus(
            day=entry.day,
            spent_usd=entry.spent_usd,
            usage=entry.usage,
            limit=await self.limit(community_id),
            refused_calls=entry.refused_calls,
        )

    async def exhausted(self, community_id: str) -> bool:
        status = await self.status(community_id)
        self._maybe_warn(community_id, status)  # a limit lowered below the spend, too
        return status.exhausted

    async def check(self, community_id: str) -> None:
        """Raise `BudgetExceeded` if the community may not call the model now."""
        status = await self.status(community_id)
        self._maybe_warn(community_id, status)
        if status.exhausted:
            assert status.limit.usd is not None
            self._days[community_id].refused_calls += 1
            raise BudgetExceeded(
                community_id, status.spent_usd, status.limit.usd, self.seconds_until_midnight()
            )

    async def record(self, community_id: str, model: str, usage: Usage) -> float:
        """Count one finished call; returns what it cost (USD).

        No look at the other processes' spend here: counting needs none, and this runs
        between a reply's model call and its sending. The next check takes it in.
        """
        cost = cost_usd(model, usage, self.prices)
        entry = await self._entry(community_id, sync=False)
        entry.spent_usd += cost
        entry.usage = entry.usage + usage
        self._maybe_warn(community_id, await self._status(community_id, entry))
        return cost

    def refused_today(self, community_id: str) -> int:
        """Calls refused so far today (learning retrying while it waits counts each time)."""
        entry = self._days.get(community_id)
        return entry.refused_calls if entry is not None and entry.day == self.today() else 0

    async def first_notice_today(self, community_id: str, user_id: str) -> bool:
        """True the first time today this member is to be told the limit is reached."""
        entry = await self._entry(community_id)
        if user_id in entry.noticed:
            return False
        entry.noticed.add(user_id)
        return True

    def roll_over(self) -> list[str]:
        """Communities whose day ended since the last call (so their waiting learning can
        resume now); forgets figures of past days."""
        today = self.today()
        for community_id, entry in list(self._days.items()):
            if entry.day != today:
                del self._days[community_id]
                self._rolled.add(community_id)
        rolled, self._rolled = sorted(self._rolled), set()
        return rolled

    def _maybe_warn(self, community_id: str, status: BudgetStatus) -> None:
        entry = self._days.get(community_id)
        if entry is not None and status.exhausted and not entry.reached:
            entry.reached = True
            assert status.limit.usd is not None
            log.info(
                "community %s reached its daily limit of %s (spent %s): no model calls "
                "until midnight %s",
                community_id,
                format_usd(status.limit.usd),
                format_usd(status.spent_usd),
                self.tz,
                extra={"community": community_id},
            )
        if entry is None or entry.warned or not status.near_limit:
            return
        entry.warned = True
        assert status.limit.usd is not None
        log.warning(
            "community %s has spent %s of its daily limit of %s (%.0f%%)",
            community_id,
            format_usd(status.spent_usd),
            format_usd(status.limit.usd),
            100 * status.spent_usd / status.limit.usd if status.limit.usd else 100,
            extra={"community": community_id},
        )

    async def _entry(self, community_id: str, *, sync: bool = True) -> _Day:
        """Today's figures; the first time a community is seen they come from the
        database (calls made before a restart still count). `sync`: with a shared
        database, take in the stored figures if they are due (see `_sync`)."""
        today = self.today()
        entry = self._days.get(community_id)
        if entry is None:
            lock = self._loading.setdefault(community_id, asyncio.Lock())
            async with lock:
                entry = self._days.get(community_id)
                if entry is None:
                    rows = await self.db.usage_days(community_id, today, today)
                    entry = _Day(
                        day=today,
                        spent_usd=sum(cost_usd(r.model, r.usage, self.prices) for r in rows),
                        usage=sum((r.usage for r in rows), Usage()),
                    )
                    self._days[community_id] = entry
            self._loading.pop(community_id, None)
        if entry.day != today:
            # Every call since the last load went through this ledger, so the new day
            # starts from nothing rather than from a database read.
            entry = _Day(day=today)
            self._days[community_id] = entry
            self._rolled.add(community_id)
        elif (
            sync
            and self.shared
            and time_module.monotonic() - entry.synced_at >= SHARED_SYNC_SECONDS
        ):
            await self._sync(community_id, entry)
        return entry

    @property
    def shared(self) -> bool:
        """Other processes spend from the same database (PostgreSQL)."""
        return self.db.coordinator is not None

    async def _sync(self, community_id: str, entry: _Day) -> None:
        """Take in what the other processes stored (see the module docstring)."""
        entry.synced_at = time_module.monotonic()
        rows = await self.db.usage_days(community_id, entry.day, entry.day)
        stored = sum(cost_usd(r.model, r.usage, self.prices) for r in rows)
        if stored > entry.spent_usd:
            entry.spent_usd = stored
            entry.usage = sum((r.usage for r in rows), Usage())
        self._limits.pop(community_id, None)  # read again: it may have changed elsewhere


class MeteredLLM(ForwardingLLM):
    """One community's view of the shared LLM client: checked against its daily limit
    before each call, and counted after it."""

    def __init__(self, inner: LLMClient, ledger: BudgetLedger, community_id: str) -> None:
        super().__init__(inner)
        self.ledger = ledger
        self.community_id = community_id

    async def _forward(
        self, purpose: str, model: str | None, call: Callable[[], Awaitable[R]]
    ) -> R:
        await self.ledger.check(self.community_id)
        return await super()._forward(purpose, model, call)

    async def _after(self, purpose: str, result: TextResult | ToolResult) -> None:
        await self.ledger.record(self.community_id, result.model, result.usage)


# ---------------------------------------------------------------------- formatting
def format_usd(value: float) -> str:
    """Dollars as people read them: cents above a dollar, tenths of a cent below."""
    if value == 0:
        return "$0"
    if value < 0.001:
        return "<$0.001"
    if value < 1:
        return f"${value:.3f}"
    return f"${value:,.2f}"


def format_tokens(count: int) -> str:
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.2f}M"


def total_tokens(usage: Usage) -> int:
    return (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_write_tokens
        + usage.cache_read_tokens
    )
