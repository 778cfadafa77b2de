"""Members' thumbs up / down on the bot's replies (Slack's feedback buttons).

Why one row per (reply, member) and not two counters: a member may press again, or
change their mind, and the count must still be one vote each; the latest press wins.
What a row holds is the least that does this: the community, the reply's platform id
(Slack's message `ts`), a hash of community and member (`storage.flood.member_key`,
never the member's id), which button, and when.

Member data all the same: a forget-me deletes the member's rows by that hash
(`storage.forget`), `my-data` lists them (`storage.export`), and erasing a community
takes them with it (the table references `communities`). Moderators see only the
totals (`/sonality status`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from storage.base import Conn, SqlBase, execute, to_db_time
from storage.flood import member_key


class FeedbackCounts(BaseModel):
    """A community's votes on replies: positive, negative, and on how many replies."""

    model_config = ConfigDict(frozen=True)

    positive: int = 0
    negative: int = 0
    replies: int = 0

    @property
    def total(self) -> int:
        return self.positive + self.negative


# Only for a community the bot keeps data for: a press on an old message of an erased
# community records nothing (and breaks no reference).
_RECORD = (
    "INSERT INTO reply_feedback (community_id, reply_id, member_key, positive, pressed_at) "
    "SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM communities WHERE id = ?) "
    "ON CONFLICT (community_id, reply_id, member_key) DO UPDATE SET "
    "positive = excluded.positive, pressed_at = excluded.pressed_at"
)


class FeedbackStore(SqlBase):
    async def record_feedback(
        self,
        community_id: str,
        reply_id: str,
        member_id: str,
        positive: bool,
        at: datetime,
        *,
        replaces: str | None = None,
    ) -> bool:
        """Record a member's vote on a reply, replacing their earlier one on it (also one
        recorded under `replaces`, an id the same reply had in an older release); False
        when the community is not (any more) one the bot keeps data for."""
        key = member_key(community_id, member_id)
        params = (community_id, reply_id, key, int(positive), to_db_time(at), community_id)

        def work(conn: Conn) -> bool:
            if replaces is not None:
                execute(
                    conn,
                    "DELETE FROM reply_feedback WHERE community_id = ? AND reply_id = ? "
                    "AND member_key = ?",
                    (community_id, replaces, key),
                )
            return execute(conn, _RECORD, params) == 1

        return await self._run_write(work, scope=community_id)

    async def feedback_counts(self, community_id: str) -> FeedbackCounts:
        row = await self._fetchone(
            "SELECT COALESCE(SUM(positive), 0), COUNT(*), COUNT(DISTINCT reply_id) "
            "FROM reply_feedback WHERE community_id = ?",
            (community_id,),
        )
        positive, votes, replies = (int(v) for v in row) if row else (0, 0, 0)
        return FeedbackCounts(positive=positive, negative=votes - positive, replies=replies)
