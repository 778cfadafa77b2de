"""Which other bots the bot answers, and how many times in a row.

Why a limit per channel: two bots that each answer the other never stop, and every
round costs a model call. Bots the operator lists in SONALITY_ANSWER_BOTS are answered
at most SONALITY_BOT_EXCHANGES times in a row in a channel (a thread counts with its
channel); a message from a person there starts the count again. A bot past the limit
is ignored without a word: a notice would be one more message for it to answer.

Why the count lives in the database (`storage.bots`): a count a restart puts back to
zero lets a loop run again after each restart, and behind a load balancer another
process would keep its own. One statement per bot reply, and on SQLite none at all for
people in channels without a count: with one process per database file, the channels
that have one are known in memory (read once at the first message). On PostgreSQL
another process may have counted, so a person's message always clears the row (one
indexed DELETE), but only while bots are allowed at all.
"""

from __future__ import annotations

import asyncio
import logging

from storage import Database

__all__ = ["BotExchanges"]

log = logging.getLogger(__name__)

Channel = tuple[str, str]  # (community id, channel id)


class BotExchanges:
    def __init__(self, db: Database, allowed: frozenset[str], limit: int) -> None:
        self._db = db
        self.allowed = allowed
        self.limit = limit
        # Several processes share the count: ask the database every time.
        self._shared = db.coordinator is not None
        # One process: the channels whose count is not zero (None: not read yet).
        self._counting: set[Channel] | None = None
        self._loading = asyncio.Lock()

    def may_answer(self, bot_id: str) -> bool:
        return bot_id in self.allowed

    async def claim(self, community_id: str, channel_id: str) -> bool:
        """Take one reply to a bot in the channel; False at the limit. A database fault
        counts as the limit: better one unanswered bot than a loop nobody counts."""
        try:
            if not self._shared:
                # Noted before the count is written: a person writing meanwhile must
                # find it here, or their message would leave the count standing.
                (await self._known()).add((community_id, channel_id))
            taken = await self._db.claim_bot_reply(community_id, channel_id, self.limit)
        except Exception:
            log.exception("could not count a reply to a bot in %s; not answering", community_id)
            return False
        if not taken:
            log.info(
                "not answering a bot in %s channel %s: %d replies to bots in a row there "
                "(SONALITY_BOT_EXCHANGES); a person writing there resets it",
                community_id,
                channel_id,
                self.limit,
            )
        return taken

    async def person_wrote(self, community_id: str, channel_id: str) -> None:
        """A person wrote in the channel: the bots' row ends. Never raises."""
        if not self.allowed:
            return  # no bot is ever answered: nothing is counted
        key = (community_id, channel_id)
        try:
            if not self._shared:
                counting = await self._known()
                if key not in counting:
                    return
                counting.discard(key)
            await self._db.clear_bot_replies(community_id, channel_id)
        except Exception:
            log.exception("could not reset the replies to bots in %s", community_id)

    async def _known(self) -> set[Channel]:
        if self._counting is None:
            async with self._loading:
                if self._counting is None:
                    self._counting = set(await self._db.bot_reply_counts())
        return self._counting
