"""The bot removed from a community, and added back: silence at once, erasure later.

Adapters report the platform's events (Discord GUILD_DELETE / GUILD_CREATE, Slack
``app_uninstalled`` / ``tokens_revoked`` and a reinstall) as `removed` / `added_back`;
nothing here knows which platform spoke.

Why the silence is kept in memory as well as in storage: `Runtime.handle` asks for every
message, and a set lookup costs nothing; storage (`community_removals`) is what makes
the removal, and its deadline, survive a restart.

What an erasure clears, beyond storage's rows: the community's loaded agent (its state
and queued learning), its memories in Chroma (through `forget_memory`, which app/wiring.py
wires to the memory host), and the runtime's per-community caches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Literal

from bot.registry import CommunityRegistry
from sonality.store import utcnow
from storage import Database
from storage.removal import Removal

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
ForgetMemory = Callable[[str], Awaitable[None]]


class CommunityRemovals:
    def __init__(
        self,
        db: Database,
        registry: CommunityRegistry,
        keep_days: int,
        forget_memory: ForgetMemory | None = None,
        clock: Clock = utcnow,
        on_erased: Callable[[str], None] | None = None,
    ) -> None:
        self.db = db
        self.registry = registry
        self.keep_for = timedelta(days=keep_days)
        self.forget_memory = forget_memory
        self.clock = clock
        self.on_erased = on_erased
        self._removed: set[str] = set()
        self._lock = asyncio.Lock()  # one removal, return or erasure at a time

    async def load(self) -> None:
        """Removals recorded before a restart keep the bot silent there."""
        self._removed = {r.community_id for r in await self.db.removals()}

    def is_removed(self, community_id: str) -> bool:
        return community_id in self._removed

    async def removed(self, community_id: str, reason: str, at: datetime | None = None) -> Removal:
        """The bot was removed: stop answering now, erase at the deadline (at once with
        SONALITY_DELETE_AFTER_REMOVAL_DAYS=0)."""
        at = at or self.clock()
        async with self._lock:
            self._removed.add(community_id)
            await self.registry.unload(community_id)
            removal = await self.db.mark_removed(community_id, at, self.keep_for)
        log.info(
            "removed from %s (%s): silent now, data erased at %s unless added back",
            community_id,
            reason,
            removal.delete_at.isoformat(timespec="seconds"),
        )
        if removal.delete_at <= at:
            await self.erase_due(at)
        return removal

    async def added_back(
        self, community_id: str, at: datetime | None = None
    ) -> Literal["kept", "erased", "not-removed"]:
        """The bot is in the community again: before the deadline nothing was lost;
        after it the community starts from the seed."""
        if community_id not in self._removed:
            return "not-removed"  # the usual case: every guild on every connect
        at = at or self.clock()
        async with self._lock:
            if community_id in await self.db.due_erasures(at):
                # Back too late and housekeeping has not erased yet: erase first, the
                # memories before the rows (see `_erase`), then it starts from the seed.
                await self._erase(community_id, at)
                outcome: Literal["kept", "erased", "not-removed"] = "erased"
            else:
                outcome = await self.db.mark_returned(community_id, at)
            self._removed.discard(community_id)
        if outcome != "not-removed":
            log.info("added back to %s: its data was %s", community_id, outcome)
        return outcome

    async def erase_due(self, now: datetime | None = None) -> list[str]:
        """Erase every removed community whose grace period is over (housekeeping)."""
        now = now or self.clock()
        erased = []
        for community_id in await self.db.due_erasures(now):
            async with self._lock:
                if community_id not in await self.db.due_erasures(now):
                    continue  # added back meanwhile
                try:
                    await self._erase(community_id, now)
                except Exception:
                    log.exception("erasing %s failed; tried again next time", community_id)
                    continue
            erased.append(community_id)
        return erased

    async def _erase(self, community_id: str, at: datetime) -> None:
        """The agent, the memories in Chroma, then the rows, then in-process caches.

        Memories go before the rows on purpose: the rows include the removal itself, so
        a crash (or a Chroma error) in between leaves the removal due and the next
        housekeeping does it all again; the other order could leave memories nobody
        would ever delete, to be found by the community when it comes back.
        """
        await self.registry.unload(community_id)
        if self.forget_memory is not None:
            await self.forget_memory(community_id)
        rows = await self.db.erase_community(community_id, at)
        if self.on_erased is not None:
            self.on_erased(community_id)
        log.info("erased %s: %d rows, its memories and conversation buffers", community_id, rows)
