"""What each member spent of their community's day (`bot.budget`'s member share).

Why a table of its own and not `usage_daily`: the daily rollup is per community and
role, and the share rule needs one figure per member, readable by every process (on
PostgreSQL several share one community's day) and kept across a restart. One row per
(community, local day, member): the estimated USD, calls and tokens of the model calls
made for that member's messages (their reply, and the ESS and insight calls that
learned from it), plus whether they were told today that their share is spent.

The USD is stored as it was estimated when the calls returned (the ledger prices each
call once), not recomputed from tokens: the share is a decision taken then.

Member data: a forget-me deletes the member's rows by their exact key
(`storage.forget`), `my-data` lists them (`storage.export`), and housekeeping deletes
the days before today (`prune_member_spend`): nothing reads a past day's shares.
Shared work (reflection) is nobody's and is only in `usage_daily`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime

from pydantic import BaseModel, ConfigDict

from storage.base import Conn, SqlBase, execute, fetchone
from storage.forgotten import forgotten_since


class MemberSpend(BaseModel):
    """One member's spend on one day (a row, or an amount to add to it)."""

    model_config = ConfigDict(frozen=True)

    community_id: str
    day: date
    member_id: str
    usd: float = 0.0
    calls: int = 0
    tokens: int = 0
    #: When the earliest message this amount was spent for came in (not stored): an
    #: amount of a member who ran forget-me since is dropped, not written.
    since: datetime | None = None


_ADD = (
    "INSERT INTO member_spend (community_id, day, member_id, usd, calls, tokens) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (community_id, day, member_id) DO UPDATE SET "
    "usd = member_spend.usd + excluded.usd, calls = member_spend.calls + excluded.calls, "
    "tokens = member_spend.tokens + excluded.tokens"
)


class MemberSpendStore(SqlBase):
    async def add_member_spend(self, amounts: Sequence[MemberSpend]) -> None:
        """Add each amount to its member's row of its day (one transaction)."""
        if not amounts:
            return

        def work(conn: Conn) -> None:
            for a in amounts:
                if a.since is not None and forgotten_since(
                    conn, a.community_id, a.member_id, a.since
                ):
                    continue  # spent on a reply that was in flight during their forget-me
                row = (a.community_id, a.day.isoformat(), a.member_id, a.usd, a.calls, a.tokens)
                execute(conn, _ADD, row)

        await self._run_write(work, scope="member-spend")

    async def member_spend(self, community_id: str, day: date) -> list[MemberSpend]:
        """Every member's spend in the community on `day`, largest first."""
        rows = await self._fetchall(
            "SELECT member_id, usd, calls, tokens FROM member_spend "
            "WHERE community_id = ? AND day = ? AND calls > 0 ORDER BY usd DESC, member_id",
            (community_id, day.isoformat()),
        )
        return [
            MemberSpend(
                community_id=community_id,
                day=day,
                member_id=str(r[0]),
                usd=float(r[1]),
                calls=int(r[2]),
                tokens=int(r[3]),
            )
            for r in rows
        ]

    async def claim_share_notice(self, community_id: str, day: date, member_id: str) -> bool:
        """True for the first caller of the day, in any process: that one tells the
        member their share is spent (one atomic statement, so two processes cannot
        both claim it)."""

        def work(conn: Conn) -> bool:
            row = fetchone(
                conn,
                "INSERT INTO member_spend (community_id, day, member_id, usd, calls, tokens, "
                "noticed) VALUES (?, ?, ?, 0, 0, 0, 1) "
                "ON CONFLICT (community_id, day, member_id) DO UPDATE SET noticed = 1 "
                "WHERE member_spend.noticed = 0 RETURNING 1",
                (community_id, day.isoformat(), member_id),
            )
            return row is not None

        return await self._run_outside_transaction(work)

    async def prune_member_spend(self, before: date) -> int:
        """Delete the rows of days before `before` (housekeeping); returns how many."""
        return await self._run_write(
            lambda conn: execute(
                conn, "DELETE FROM member_spend WHERE day < ?", (before.isoformat(),)
            ),
            scope="member-spend",
        )
