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

A member's share. One member flooding long messages could otherwise spend the whole
day for everyone, so no member may spend more than `member_share` of the community's
limit (SONALITY_MEMBER_BUDGET_SHARE, default half; 1 turns it off). A call is the
member's when it is made for their message: the reply (the runtime names the member in
`SPENDER` around the reply) and the ESS and insight calls that learn from it (the
agent's learning queue says whose message it is learning). Reflection is shared work
and nobody's: it counts against the community only. Past their share a member's
messages get no reply (one short notice a day, claimed in the database so that several
processes tell them once) and the others are still answered. Only replies are held
back: learning from messages already answered still runs (learning goes in order, so
holding one member's back would hold back everyone's), and counts, so a member can
end slightly over their share. The terminal's operator is never held back.

Each member's figure is kept like the community's, in memory as calls return, and
written to `member_spend` right after (in the background, so a reply waits for no
write): a restart starts from the stored figures, and with several processes on one
PostgreSQL database each takes the others' figures in at the same sync.

A forgotten member (forget-me, forget-user) loses their figure: their stored rows are
deleted (`storage.forget`), the process that forgot them drops its own at once
(`forget_member`), and every other process at its next sync, where a member counted
here whose stored row is gone, with nothing of theirs waiting to be written, is
dropped. The community's own spend stays as it was (the money was spent): what the
member spent is nobody's now, like reflection.
"""

from __future__ import annotations

import asyncio
import logging
import time as time_module
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
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
from storage.spend import MemberSpend

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


class MemberShareExceeded(BudgetExceeded):
    """The member has spent their share of the community's day: no reply to them until
    midnight (the community's other members are still answered)."""

    def __init__(
        self,
        community_id: str,
        member_id: str,
        spent_usd: float,
        share_usd: float,
        retry_after: float,
    ) -> None:
        super().__init__(community_id, spent_usd, share_usd, retry_after)
        self.member_id = member_id


@dataclass(frozen=True)
class Spender:
    """Whose message a reply call is made for; `limited` False for the terminal's
    operator, who is counted but never held back."""

    member_id: str
    limited: bool = True
    #: When their message came in: a forget-me of theirs journaled since then means the
    #: spend must not be stored (the reply was in flight), as for the message itself.
    since: datetime = field(default_factory=utcnow)


SPENDER: ContextVar[Spender | None] = ContextVar("sonality_spender", default=None)
"""Set by the runtime around a member's reply: the member the reply call is for."""


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
    # Today's spend of each member (USD), and the members whose reaching their share
    # was logged.
    members: dict[str, float] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    # Members forgotten today in this process, and when: a call for a message of theirs
    # from before then (a reply in flight) is not theirs any more.
    forgotten: dict[str, datetime] = field(default_factory=dict)


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
        member_share: float = 1.0,
    ) -> None:
        self.db = db
        self.default_limit_usd = default_limit_usd
        self.member_share = member_share
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
        # Members' spend not yet written to `member_spend`, and the task writing it.
        self._unwritten: dict[tuple[str, date, str], MemberSpend] = {}
        # What the writes under way hold (neither unwritten nor stored yet).
        self._in_flight: list[dict[tuple[str, date, str], MemberSpend]] = []
        self._writing: asyncio.Task[None] | None = None
        self._write_failed = False

    @classmethod
    def from_settings(cls, db: Database, settings: Settings, clock: Clock = utcnow) -> BudgetLedger:
        return cls(
            db,
            default_limit_usd=settings.daily_budget_usd,
            prices=settings.prices,
            timezone=settings.timezone,
            clock=clock,
            dm_moderation=settings.dm_moderation,
            member_share=settings.member_budget_share,
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

    async def record(
        self,
        community_id: str,
        model: str,
        usage: Usage,
        member_id: str | None = None,
        *,
        since: datetime | None = None,
    ) -> float:
        """Count one finished call, made for `member_id`'s message (None: shared work);
        returns what it cost (USD).

        No look at the other processes' spend here: counting needs none, and this runs
        between a reply's model call and its sending. The next check takes it in; the
        member's part is written to the database in the background.
        """
        cost = cost_usd(model, usage, self.prices)
        entry = await self._entry(community_id, sync=False)
        entry.spent_usd += cost
        entry.usage = entry.usage + usage
        if member_id is not None and not _forgotten_since(entry, member_id, since):
            entry.members[member_id] = entry.members.get(member_id, 0.0) + cost
            self._write_later(community_id, entry.day, member_id, cost, total_tokens(usage), since)
        self._maybe_warn(community_id, await self._status(community_id, entry))
        return cost

    # ------------------------------------------------------------------ members
    async def share_usd(self, community_id: str) -> float | None:
        """The most one member may spend today; None when no share applies (no limit,
        or the share turned off)."""
        limit = await self.limit(community_id)
        if limit.usd is None or self.member_share >= 1:
            return None
        return self.member_share * limit.usd

    async def member_spent(self, community_id: str) -> dict[str, float]:
        """Today's spend of each member who spent anything (USD)."""
        entry = await self._entry(community_id)
        return {m: usd for m, usd in entry.members.items() if usd > 0}

    def forget_member(self, community_id: str, member_id: str) -> None:
        """The member was forgotten (their stored figures are deleted): today's spend
        is no longer theirs, here (see the module docstring for the other processes).
        The community's spend stays."""
        for key in [k for k in self._unwritten if k[0] == community_id and k[2] == member_id]:
            del self._unwritten[key]
        entry = self._days.get(community_id)
        if entry is not None:
            entry.members.pop(member_id, None)
            entry.stopped.discard(member_id)
            entry.forgotten[member_id] = utcnow()

    async def member_over_share(self, community_id: str, member_id: str) -> bool:
        """Whether the member has spent their share of the community's day."""
        entry = await self._entry(community_id)
        share = await self.share_usd(community_id)
        spent = entry.members.get(member_id, 0.0)
        if share is None or spent < share:
            return False
        if member_id not in entry.stopped:
            entry.stopped.add(member_id)
            log.info(
                "a member of %s spent their share of the daily limit (%s of %s): no replies "
                "to them until midnight %s",
                community_id,
                format_usd(spent),
                format_usd(share),
                self.tz,
                extra={"community": community_id},
            )
        return True

    async def check_member(self, community_id: str, member_id: str) -> None:
        """Raise `MemberShareExceeded` if a reply to the member may not be made now."""
        if await self.member_over_share(community_id, member_id):
            share = await self.share_usd(community_id)
            assert share is not None
            spent = (await self._entry(community_id)).members.get(member_id, 0.0)
            raise MemberShareExceeded(
                community_id, member_id, spent, share, self.seconds_until_midnight()
            )

    async def first_share_notice_today(self, community_id: str, member_id: str) -> bool:
        """True the first time today, in any process, that the member is to be told their
        share is spent (claimed in the database: a restart does not tell them again)."""
        return await self.db.claim_share_notice(community_id, self.today(), member_id)

    def _write_later(
        self,
        community_id: str,
        day: date,
        member_id: str,
        usd: float,
        tokens: int,
        since: datetime | None,
    ) -> None:
        key = (community_id, day, member_id)
        amount = MemberSpend(
            community_id=community_id,
            day=day,
            member_id=member_id,
            usd=usd,
            calls=1,
            tokens=tokens,
            since=since,
        )
        known = self._unwritten.get(key)
        self._unwritten[key] = amount if known is None else _added(known, amount)
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write(), name="member-spend")

    async def _write(self) -> None:
        """Write the members' spend until none is left; on a fault keep it for the next
        call (or `flush`), with one warning per outage."""
        while self._unwritten:
            batch, self._unwritten = self._unwritten, {}
            self._in_flight.append(batch)
            try:
                await self.db.add_member_spend([batch[k] for k in sorted(batch)])
            except Exception as exc:
                for key, amount in batch.items():
                    later = self._unwritten.get(key)
                    self._unwritten[key] = amount if later is None else _added(amount, later)
                if not self._write_failed:
                    log.warning("could not store the members' spend (kept for later): %s", exc)
                self._write_failed = True
                return
            finally:
                self._in_flight.remove(batch)
            if self._write_failed:
                log.info("the members' spend is stored again")
            self._write_failed = False

    async def flush(self) -> None:
        """Write what members spent and is not stored yet (at shutdown)."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        await self._write()

    async def prune_members(self) -> int:
        """Delete the stored figures of past days (housekeeping): nothing reads them."""
        return await self.db.prune_member_spend(self.today())

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
                    stored = await self.db.member_spend(community_id, today)
                    self._take_members(entry, community_id, stored, set())
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
        waiting = self._waiting(community_id, entry.day)  # before the read: see below
        stored_members = await self.db.member_spend(community_id, entry.day)
        self._take_members(entry, community_id, stored_members, waiting)
        self._limits.pop(community_id, None)  # read again: it may have changed elsewhere

    def _take_members(
        self, entry: _Day, community_id: str, stored: list[MemberSpend], waiting: set[str]
    ) -> None:
        """Take each member's stored figure, plus what this process has not written
        yet, where it is higher than the one counted here (the other processes' calls);
        drop a member counted here whose stored row is gone (forgotten, in any process)
        and who has nothing waiting to be written, before the read (`waiting`: an amount
        written while the figures were read) or now."""
        for row in stored:
            unwritten = self._unwritten.get((row.community_id, entry.day, row.member_id))
            figure = row.usd + (unwritten.usd if unwritten else 0.0)
            if figure > entry.members.get(row.member_id, 0.0):
                entry.members[row.member_id] = figure
        kept = {row.member_id for row in stored} | waiting | self._waiting(community_id, entry.day)
        for member in [m for m in entry.members if m not in kept]:
            del entry.members[member]
            entry.stopped.discard(member)

    def _waiting(self, community_id: str, day: date) -> set[str]:
        """The members whose spend of the day this process has yet to store."""
        return {
            member
            for pending in (self._unwritten, *self._in_flight)
            for (cid, when, member) in pending
            if cid == community_id and when == day
        }


class MeteredLLM(ForwardingLLM):
    """One community's view of the shared LLM client: checked against its daily limit
    (and a reply against its member's share) before each call, and counted after it,
    for the member whose message it serves.

    `learning_member` says whose message the community's learning works on now (set
    once the agent exists; None: nobody's).
    """

    def __init__(
        self,
        inner: LLMClient,
        ledger: BudgetLedger,
        community_id: str,
        learning_member: Callable[[], Spender | None] = lambda: None,
    ) -> None:
        super().__init__(inner)
        self.ledger = ledger
        self.community_id = community_id
        self.learning_member = learning_member

    def _member(self, purpose: str) -> Spender | None:
        if purpose == REPLY:
            return SPENDER.get()
        if purpose == REFLECTION:
            return None  # shared work: the community's, nobody's share
        return self.learning_member()

    async def _forward(
        self, purpose: str, model: str | None, call: Callable[[], Awaitable[R]]
    ) -> R:
        await self.ledger.check(self.community_id)
        spender = SPENDER.get()
        if purpose == REPLY and spender is not None and spender.limited:
            await self.ledger.check_member(self.community_id, spender.member_id)
        return await super()._forward(purpose, model, call)

    async def _spent(self, purpose: str, spent: TextResult) -> None:
        await self._after(purpose, spent)  # paid for, though the call failed after

    async def _after(self, purpose: str, result: TextResult | ToolResult) -> None:
        spender = self._member(purpose)
        await self.ledger.record(
            self.community_id,
            result.model,
            result.usage,
            None if spender is None else spender.member_id,
            since=None if spender is None else spender.since,
        )


#: The purposes `MeteredLLM` attributes by (the engine's names for its calls).
REPLY = "reply"
REFLECTION = "reflection"


def _forgotten_since(entry: _Day, member_id: str, since: datetime | None) -> bool:
    """Whether the member was forgotten after the message a call was made for came in
    (`since`; None: not known, the call is theirs)."""
    forgotten = entry.forgotten.get(member_id)
    if forgotten is None or since is None:
        return False
    return (since if since.tzinfo is not None else since.replace(tzinfo=UTC)) <= forgotten


def _added(a: MemberSpend, b: MemberSpend) -> MemberSpend:
    """Two amounts of one member's day as one; the forget check goes by the earlier
    message (`since`), so an amount holding an in-flight reply's cost is never stored."""
    times = [t for t in (a.since, b.since) if t is not None]
    return a.model_copy(
        update={
            "usd": a.usd + b.usd,
            "calls": a.calls + b.calls,
            "tokens": a.tokens + b.tokens,
            "since": min(times) if times else None,
        }
    )


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


#: Members listed by name in `usage`; the rest are summed on one line.
MAX_MEMBERS_SHOWN = 10
#: Column of a member's name in `usage`: a name (or `UNNAMED`, or `SHARED`) up to one
#: character less reads whole, and a line stays within 60 characters.
NAME_WIDTH = 31
#: A member whose name is not stored (they never spoke under one here).
UNNAMED = "a member (no name stored)"
#: What no member listed spent: shared work (reflection) and the forgotten members'.
SHARED = "shared (reflection, forgotten)"


def member_share_lines(
    spent: Mapping[str, float],
    names: Mapping[str, str],
    status: BudgetStatus,
    share_usd: float | None,
) -> list[str]:
    """Moderators' view: today's spend of each member, largest first, by name, against
    the community's limit; what no member listed caused (reflection, and what forgotten
    members spent) on a line of its own. At most 60 characters wide."""
    limit = status.limit.usd
    lines = ["", f"Member share: {_share_rule(status, share_usd)}", "Members today:"]
    ranked = sorted(spent.items(), key=lambda kv: (-kv[1], kv[0]))
    for member, usd in ranked[:MAX_MEMBERS_SHOWN]:
        name = _short_name(names.get(member) or UNNAMED)
        part = f"{usd / limit:>5.0%}" if limit else ""
        mark = "  stopped" if share_usd is not None and usd >= share_usd else ""
        lines.append(f"  {name:<{NAME_WIDTH}}{format_usd(usd):>9} {part}{mark}".rstrip())
    rest = ranked[MAX_MEMBERS_SHOWN:]
    if rest:
        usd = sum(u for _, u in rest)
        label = f"{len(rest)} more member{'s' if len(rest) != 1 else ''}"
        lines.append(f"  {label:<{NAME_WIDTH}}{format_usd(usd):>9}")
    if not ranked:
        lines.append("  nobody has spent anything yet")
    shared = status.spent_usd - sum(spent.values())
    if shared >= 0.0005:
        lines.append(f"  {SHARED:<{NAME_WIDTH}}{format_usd(shared):>9}")
    return lines


def own_share_lines(usd: float, status: BudgetStatus, share_usd: float | None) -> list[str]:
    """A member's view: their own spend today, and the rule."""
    limit = status.limit.usd
    part = f" ({usd / limit:.0%} of the daily limit)" if limit else ""
    return [
        "",
        f"Member share: {_share_rule(status, share_usd)}",
        f"Your messages today: {format_usd(usd)}{part}",
    ]


def _share_rule(status: BudgetStatus, share_usd: float | None) -> str:
    """What one member may spend today, in words (at most 45 characters)."""
    if status.limit.usd is None:
        return "none (no daily limit)"
    if share_usd is None:
        return "off (SONALITY_MEMBER_BUDGET_SHARE=1)"
    return (
        f"up to {format_usd(share_usd)} each "
        f"({share_usd / status.limit.usd if status.limit.usd else 0:.0%} of the limit)"
    )


def _short_name(name: str) -> str:
    name = " ".join(name.split())
    return name if len(name) <= NAME_WIDTH - 1 else name[: NAME_WIDTH - 2] + "…"


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
