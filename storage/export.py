"""What the SQLite file holds about one member of one community (`/sonality my-data`).

Why a read of its own: a member asking "what do you keep about me?" must get every row
that is theirs, from every table that quotes or names them, and nothing of anyone
else's. Each query is scoped by community and by the member's platform id; the bot
adds the episodes held in Chroma (`bot.mydata`), which this package cannot see.

The tables read, and why each: ``interactions`` (their messages, the replies and the
tokens each reply cost), ``conversation_turns`` (the short-term buffer of their recent
exchanges), ``episode_outbox`` (episodes of their messages not yet written to
Chroma), ``audit_events`` of kind "ess" whose speaker is them (how each message was
rated and which opinion updates it staged), ``evidence_log`` (the same ratings kept for
good, with their one-line summaries, for the forget-me replay: the audit trail's copy
expires), ``moderator_actions`` they took and, on PostgreSQL, their ``flood_windows``
count (found by its hash of community and member), ``member_spend`` (what the model
calls for their messages cost today, for their share of the spending limit), and
``reply_feedback`` (their thumbs up / down on replies, found by the same hash). Token
usage per day (``usage_daily``) is per community, not per member, so it is not theirs;
the per-message usage is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from sonality.evidence import EvidenceStep
from storage.base import Conn, SqlBase, fetchall, fetchone, from_db_time, from_json, id_chunks
from storage.community import step_from_row
from storage.flood import member_key


class StoredMessage(BaseModel):
    """One message of the member and the bot's reply, as the outbox keeps it. Empty
    texts mean retention already erased them."""

    model_config = ConfigDict(frozen=True)

    interaction_id: str
    created_at: datetime
    name_used: str
    message: str
    reply: str
    status: str
    model: str
    usage: dict[str, Any]


class StoredTurn(BaseModel):
    model_config = ConfigDict(frozen=True)

    exchange: int
    role: str
    content: str
    created_at: datetime


class StoredRating(BaseModel):
    """The audit trail's "ess" event of one of the member's messages: its rating and the
    opinion updates it staged (topic, signed step, interaction due)."""

    model_config = ConfigDict(frozen=True)

    version: int
    interaction: int
    created_at: datetime
    payload: dict[str, Any]


class StoredEvidence(BaseModel):
    """One of the member's messages as the evidence log keeps it, for good."""

    model_config = ConfigDict(frozen=True)

    version: int
    interaction: int
    interaction_id: str
    score: float
    reasoning_type: str
    opinion_direction: str
    topics: tuple[str, ...]
    summary: str


class StoredFloodCount(BaseModel):
    """The shared flood-control row (PostgreSQL), gone a window after the last message."""

    model_config = ConfigDict(frozen=True)

    window_start: datetime
    messages: int
    last_message: datetime
    previous_window_messages: int


class StoredSpend(BaseModel):
    """What the member's messages cost on one day (their share of the spending limit)."""

    model_config = ConfigDict(frozen=True)

    day: str
    usd: float
    calls: int
    tokens: int
    told_share_spent: bool


class StoredFeedback(BaseModel):
    """The member's vote on one reply (Slack's feedback buttons), the latest press."""

    model_config = ConfigDict(frozen=True)

    reply_id: str
    positive: bool
    pressed_at: datetime


class StoredModeratorAction(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: str
    args: str
    reason: str
    allowed: bool
    created_at: datetime


class MemberRows(BaseModel):
    """Every SQLite row of one member in one community."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[StoredMessage, ...] = ()
    conversation_turns: tuple[StoredTurn, ...] = ()
    unwritten_episodes: tuple[dict[str, Any], ...] = ()
    ratings: tuple[StoredRating, ...] = ()
    evidence: tuple[StoredEvidence, ...] = ()
    moderator_actions: tuple[StoredModeratorAction, ...] = ()
    flood: StoredFloodCount | None = None
    spend: tuple[StoredSpend, ...] = ()
    feedback: tuple[StoredFeedback, ...] = ()

    @property
    def interaction_ids(self) -> list[str]:
        return [m.interaction_id for m in self.messages]


class ExportStore(SqlBase):
    async def member_rows(self, community_id: str, member_id: str) -> MemberRows:
        """All of `member_id`'s rows in `community_id`, oldest first, in one snapshot."""

        def work(conn: Conn) -> MemberRows:
            messages = tuple(
                StoredMessage(
                    interaction_id=str(r[0]),
                    created_at=from_db_time(r[1]),
                    name_used=str(r[2]),
                    message=str(r[3]),
                    reply=str(r[4]),
                    status=str(r[5]),
                    model=str(r[6]),
                    usage=_dict(r[7]),
                )
                for r in fetchall(
                    conn,
                    "SELECT id, created_at, speaker_name, message, reply, status, model, "
                    "usage_json FROM interactions WHERE community_id = ? AND speaker_id = ? "
                    "ORDER BY seq",
                    (community_id, member_id),
                )
            )
            turns = tuple(
                StoredTurn(
                    exchange=int(r[0]),
                    role=str(r[1]),
                    content=str(r[2]),
                    created_at=from_db_time(r[3]),
                )
                for r in fetchall(
                    conn,
                    "SELECT exchange, role, content, created_at FROM conversation_turns "
                    "WHERE community_id = ? AND user_id = ? ORDER BY exchange, id",
                    (community_id, member_id),
                )
            )
            ids = [m.interaction_id for m in messages]
            episodes: list[dict[str, Any]] = []
            for chunk, marks in id_chunks(ids):
                episodes += [
                    _dict(r[0])
                    for r in fetchall(
                        conn,
                        "SELECT episode_json FROM episode_outbox WHERE community_id = ? "
                        f"AND episode_id IN ({marks}) ORDER BY seq",
                        (community_id, *chunk),
                    )
                ]
            ratings = tuple(
                StoredRating(
                    version=int(r[0]),
                    interaction=int(r[1]),
                    created_at=from_db_time(r[2]),
                    payload=_dict(r[3]),
                )
                for r in fetchall(
                    conn,
                    "SELECT version, interaction, created_at, payload_json FROM audit_events "
                    "WHERE community_id = ? AND kind = 'ess' "
                    f"AND {conn.dialect.json_text('payload_json', 'speaker')} = ? ORDER BY id",
                    (community_id, member_id),
                )
            )
            evidence = tuple(
                _evidence(step_from_row(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4])))
                for r in fetchall(
                    conn,
                    "SELECT version, kind, interaction_id, member, step_json FROM evidence_log "
                    "WHERE community_id = ? AND member = ? AND kind = 'message' ORDER BY seq",
                    (community_id, member_id),
                )
            )
            flood = fetchone(
                conn,
                "SELECT window_start, hits, last_hit, previous_hits FROM flood_windows "
                "WHERE community_id = ? AND member_key = ?",
                (community_id, member_key(community_id, member_id)),
            )
            actions = tuple(
                StoredModeratorAction(
                    action=str(r[0]),
                    args=str(r[1]),
                    reason=str(r[2]),
                    allowed=bool(r[3]),
                    created_at=from_db_time(r[4]),
                )
                for r in fetchall(
                    conn,
                    "SELECT action, args, reason, allowed, created_at FROM moderator_actions "
                    "WHERE community_id = ? AND actor_id = ? ORDER BY id",
                    (community_id, member_id),
                )
            )
            spend = tuple(
                StoredSpend(
                    day=str(r[0]),
                    usd=float(r[1]),
                    calls=int(r[2]),
                    tokens=int(r[3]),
                    told_share_spent=bool(r[4]),
                )
                for r in fetchall(
                    conn,
                    "SELECT day, usd, calls, tokens, noticed FROM member_spend "
                    "WHERE community_id = ? AND member_id = ? ORDER BY day",
                    (community_id, member_id),
                )
            )
            feedback = tuple(
                StoredFeedback(
                    reply_id=str(r[0]), positive=bool(r[1]), pressed_at=from_db_time(r[2])
                )
                for r in fetchall(
                    conn,
                    "SELECT reply_id, positive, pressed_at FROM reply_feedback "
                    "WHERE community_id = ? AND member_key = ? ORDER BY pressed_at, reply_id",
                    (community_id, member_key(community_id, member_id)),
                )
            )
            return MemberRows(
                messages=messages,
                conversation_turns=turns,
                unwritten_episodes=tuple(episodes),
                ratings=ratings,
                evidence=evidence,
                moderator_actions=actions,
                flood=None
                if flood is None
                else StoredFloodCount(
                    window_start=from_db_time(flood[0]),
                    messages=int(flood[1]),
                    last_message=from_db_time(flood[2]),
                    previous_window_messages=int(flood[3]),
                ),
                spend=spend,
                feedback=feedback,
            )

        return await self._run_read(work)


def _evidence(step: EvidenceStep) -> StoredEvidence:
    ess = step.ess
    return StoredEvidence(
        version=step.version,
        interaction=step.interaction,
        interaction_id=step.interaction_id,
        score=0.0 if ess is None else ess.score,
        reasoning_type="" if ess is None else ess.reasoning_type,
        opinion_direction="" if ess is None else ess.opinion_direction,
        topics=() if ess is None else ess.topics,
        summary="" if ess is None else ess.summary,
    )


def _dict(raw: object) -> dict[str, Any]:
    """A JSON object column; anything else (an older or foreign writer) as {"raw": ...}."""
    try:
        value = from_json(str(raw)) if raw is not None else {}
    except ValueError:
        return {"raw": str(raw)}
    return value if isinstance(value, dict) else {"raw": value}
