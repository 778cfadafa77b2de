"""Forget-me and forget-user: the steps, in order, each safe to run again.

Why here (bot/): it wires the engine (a new version whose opinions are replayed without
the member, `SonalityAgent.forget_member`) to the store (the journal, deleting and
redacting rows, `storage.forget`). The journal row is written first; `resume_forgets`
runs on start and finishes whatever a crash interrupted, so a member is never left
half-forgotten.

Steps: 1. journal; 2. the replayed version (skipped if already committed: the newest
version is this request's); 3. delete the member's episodes (their ids are the
interaction ids, read first) from Chroma and from the agent's write-behind queue, then
delete and redact every SQLite row (the episode outbox included), closing the request
in the same transaction. Other processes sharing the store may hold the member's
episodes in their own queues: they write none of them after this delete
(`storage.community.EpisodeGuard`). For tests, `SONALITY_TEST_KILL_AT_FORGET_STEP=<n>` kills the
process with SIGKILL right before step n.

The member's consolidated insights (semantic memories, ids `insight-v…`) are found by
their text, which the audit trail records with the message they were drawn from, in
Chroma and in the episode outbox (not written yet); an insight whose audit row the
audit retention already deleted is no longer traceable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from sonality.agent import SonalityAgent
from sonality.memory.episodes import document_of
from sonality.store import SEMANTIC
from storage import Database
from storage.forget import ForgetRequest

log = logging.getLogger(__name__)

KILL_HOOK = "SONALITY_TEST_KILL_AT_FORGET_STEP"


def _step(n: int) -> None:
    if os.environ.get(KILL_HOOK) == str(n):
        os.kill(os.getpid(), signal.SIGKILL)


async def forget_member(
    db: Database,
    agent: SonalityAgent,
    community_id: str,
    member_id: str,
    *,
    requested_by: str,
    reason: str = "",
) -> ForgetRequest:
    """Forget `member_id` in `community_id`; returns the finished request (with the
    pseudonym and the forget-me version)."""
    request = await db.begin_forget(
        community_id, member_id, requested_by, reason, datetime.now(UTC)
    )
    return await finish_forget(db, agent, request)


async def finish_forget(
    db: Database, agent: SonalityAgent, request: ForgetRequest
) -> ForgetRequest:
    member = request.member_id
    if member is None:
        return request
    words = await db.member_words(request.community_id, member)
    version = request.version
    _step(2)
    if version is None:
        store = db.community(request.community_id)
        newest = await store.versions(limit=1)
        latest = newest[0] if newest else None
        if latest is not None and latest.cause == "forget-me" and latest.actor == request.pseudonym:
            version = latest.version  # committed before a crash
        else:
            state = await agent.forget_member(member, actor=request.pseudonym, drop_insights=words)
            version = state.version
        await db.set_forget_version(request.id, version)
    _step(3)
    # Chroma first: the interactions rows, which hold the episode ids, and the audit
    # rows, which hold the insights drawn from the member's messages, go in erase_member.
    ids = await db.member_interaction_ids(request.community_id, member)
    ids += await _semantic_ids(db, agent, request.community_id, words)
    await agent.forget_episodes(member, ids)
    await db.erase_member(request, words, datetime.now(UTC))
    log.info(
        "%s: forgot a member as %s (v%d)",
        request.community_id,
        request.pseudonym,
        version,
        extra={"community": request.community_id},
    )
    return request.model_copy(update={"version": version, "member_id": None})


async def _semantic_ids(
    db: Database, agent: SonalityAgent, community_id: str, words: Sequence[str]
) -> list[str]:
    """The consolidated insights (semantic memories) drawn from the member's messages:
    those whose text is one the audit trail recorded for them (`member_words`), in
    Chroma or still waiting in the episode outbox (a reflection committed them moments
    ago, and this process or another holds them for its next batch)."""
    if not words:
        return []
    wanted = set(words)
    waiting = [
        e.id
        for e in await db.community(community_id).pending_episodes()
        if e.memory_type == SEMANTIC and document_of(e) in wanted
    ]
    found = await asyncio.to_thread(agent.episodes.semantic_ids, list(words))
    return [*waiting, *(str(i) for i in found if str(i) not in waiting)]


async def reapply_after_rollback(
    db: Database, agent: SonalityAgent, community_id: str, target: int
) -> bool:
    """After a rollback to `target`: if a forget-me happened after it, replay the
    opinions again so the restored state holds none of the forgotten members' influence.
    Returns whether it re-applied."""
    later = [f for f in await db.finished_forgets(community_id) if (f.version or 0) > target]
    if not later:
        return False
    await agent.forget_member(
        None,
        actor="rollback",
        change=f"forget-me re-applied after the rollback to v{target}",
    )
    return True


async def resume_forgets(
    db: Database, agent_for: Callable[[str], Awaitable[SonalityAgent]]
) -> list[ForgetRequest]:
    """Finish every forget-me a crash interrupted (run on start, before any message of
    the community is learned); returns the requests finished."""
    done = []
    for request in await db.open_forgets():
        log.warning(
            "%s: finishing an interrupted forget-me (%s)",
            request.community_id,
            request.pseudonym,
            extra={"community": request.community_id},
        )
        done.append(await finish_forget(db, await agent_for(request.community_id), request))
    return done
