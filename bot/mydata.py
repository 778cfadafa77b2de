"""`/sonality my-data`: everything stored about the caller in this community, as JSON.

Why a file and not a chat answer: the export is for the member to keep, read or hand
to someone (a data access request), and can be long. It is always private: each
adapter delivers the file to the caller alone (an ephemeral Discord answer, a Slack
DM, a path at the terminal).

What goes in, and from where: their messages and the bot's replies with the tokens
each reply cost, the short-term conversation buffer, the audit trail's rating of each
message with the opinion updates it staged, the moderator actions they took and the
channel modes they set (all from SQLite, `storage.export`), and the episodes of their
messages as Chroma holds them (document and metadata), plus those still waiting to be
written. Only the caller's
own platform id selects rows, so another member's data can never be in it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bot.messages import MY_DATA_FILE_PREFIX, Attachment, CommandRequest, CommandResult
from sonality.agent import SonalityAgent
from sonality.state import SpongeState
from storage.channels import ChannelSetting
from storage.export import (
    MemberRows,
    StoredEvidence,
    StoredFeedback,
    StoredFloodCount,
    StoredMessage,
    StoredModeratorAction,
    StoredRating,
    StoredSpend,
    StoredTurn,
)
from storage.people import StagedEntry

FORMAT = "sonality-member-data/2"
NOT_PER_MEMBER = (
    "Daily token totals, the personality's versions and its self-description are kept per "
    "community, not per member, so they are not listed here. Opinion updates your "
    "messages staged are listed under opinion_updates; a staged update becomes part of "
    "an opinion once its cooling period ends."
)


class OpinionUpdate(BaseModel):
    """One opinion update one of the member's messages staged."""

    model_config = ConfigDict(frozen=True)

    interaction_id: str
    version: int  # the personality version whose commit staged it
    topic: str
    delta: float
    due_interaction: int


class CreditedMove(BaseModel):
    """A belief whose latest committed move the member's message took part in (the
    belief's provenance, kept through netting): what their argument did to an opinion."""

    model_config = ConfigDict(frozen=True)

    topic: str
    stance_now: float
    interaction_id: str
    version: int  # the version whose commit staged the update
    delta: float
    committed_at_interaction: int


class UsageTotal(BaseModel):
    model_config = ConfigDict(frozen=True)

    replies: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class MemberExport(BaseModel):
    """The export file's shape (its `format` names the version of this shape)."""

    model_config = ConfigDict(frozen=True)

    format: str = FORMAT
    community: str
    member_id: str
    names_used: tuple[str, ...]
    exported_at: datetime
    messages: tuple[StoredMessage, ...]
    conversation_turns: tuple[StoredTurn, ...]
    episodes: tuple[dict[str, Any], ...]
    unwritten_episodes: tuple[dict[str, Any], ...]
    ratings: tuple[StoredRating, ...]
    evidence: tuple[StoredEvidence, ...] = ()
    opinion_updates: tuple[OpinionUpdate, ...]
    credited_moves: tuple[CreditedMove, ...] = ()
    moderator_actions: tuple[StoredModeratorAction, ...]
    flood_count: StoredFloodCount | None = None
    spend_per_day: tuple[StoredSpend, ...] = ()
    reply_feedback: tuple[StoredFeedback, ...] = ()
    #: Channels whose mode (mention, free, off) the member set as a moderator.
    channel_modes: tuple[ChannelSetting, ...] = ()
    reply_usage: UsageTotal
    not_per_member: str = NOT_PER_MEMBER


def build_export(
    community_id: str,
    member_id: str,
    rows: MemberRows,
    episodes: Sequence[dict[str, Any]],
    now: datetime,
) -> MemberExport:
    updates = []
    for rating in rows.ratings:
        staged = rating.payload.get("staged")
        for item in staged if isinstance(staged, list) else []:
            try:
                entry = StagedEntry.model_validate(item)
            except ValidationError:
                continue
            updates.append(
                OpinionUpdate(
                    interaction_id=str(rating.payload.get("interaction_id", "")),
                    version=rating.version,
                    topic=entry.topic,
                    delta=entry.delta,
                    due_interaction=entry.due,
                )
            )
    usage = UsageTotal(
        replies=len(rows.messages),
        input_tokens=sum(_int(m.usage.get("input_tokens")) for m in rows.messages),
        output_tokens=sum(_int(m.usage.get("output_tokens")) for m in rows.messages),
    )
    written = {str(e.get("id")) for e in episodes}
    return MemberExport(
        community=community_id,
        member_id=member_id,
        names_used=tuple(dict.fromkeys(m.name_used for m in rows.messages if m.name_used)),
        exported_at=now,
        messages=rows.messages,
        conversation_turns=rows.conversation_turns,
        episodes=tuple(episodes),
        unwritten_episodes=tuple(
            e for e in rows.unwritten_episodes if str(e.get("id")) not in written
        ),
        ratings=rows.ratings,
        evidence=rows.evidence,
        opinion_updates=tuple(updates),
        moderator_actions=rows.moderator_actions,
        flood_count=rows.flood,
        spend_per_day=rows.spend,
        reply_feedback=rows.feedback,
        channel_modes=rows.channel_modes,
        reply_usage=usage,
    )


async def run_my_data(db: Any, agent: SonalityAgent, request: CommandRequest) -> CommandResult:
    """The caller's export as a private file. `db` is the `storage.Database`."""
    community_id = request.community.id
    member_id = request.caller.id
    rows: MemberRows = await db.member_rows(community_id, member_id)
    episodes = await asyncio.to_thread(agent.episodes.stored, rows.interaction_ids)
    export = build_export(community_id, member_id, rows, episodes, datetime.now(UTC))
    export = export.model_copy(update={"credited_moves": credited_moves(agent.sponge, member_id)})
    data = export.model_dump_json(indent=2).encode()
    memories = len(export.episodes) + len(export.unwritten_episodes)
    counts = (
        f"{len(export.messages)} message(s), {memories} memory(ies), "
        f"{len(export.evidence)} evidence record(s), "
        f"{len(export.opinion_updates)} opinion update(s), "
        f"{len(export.moderator_actions)} moderator action(s)"
    )
    return CommandResult(
        text=f"Everything I keep about you here: {counts}. Only you can see this file.",
        title="Your data",
        private=True,
        files=(
            Attachment(
                name=f"{MY_DATA_FILE_PREFIX}{_safe(member_id)}.json",
                data=data,
                mime_type="application/json",
                description="Your data as JSON",
            ),
        ),
    )


def credited_moves(state: SpongeState, member_id: str) -> tuple[CreditedMove, ...]:
    return tuple(
        CreditedMove(
            topic=topic,
            stance_now=state.opinion_vectors.get(topic, 0.0),
            interaction_id=source.interaction_id,
            version=source.version,
            delta=source.delta,
            committed_at_interaction=meta.last_reinforced,
        )
        for topic, meta in sorted(state.belief_meta.items())
        for source in meta.moved_by
        if source.member == member_id
    )


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")[:60] or "member"


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
