"""Forget-me and forget-user: the steps, in order, each safe to run again.

Why here (bot/): it wires the engine (a new version whose opinions are replayed without
the member, `SonalityAgent.forget_member`) to the store (the journal, deleting and
redacting rows, `storage.forget`). The journal row is written first; `resume_forgets`
runs on start and finishes whatever a crash interrupted, so a member is never left
half-forgotten.

Steps: 1. journal (from then on no message of the member is recorded, not even a reply
that was in flight: `storage.forgotten`), and the copy of the journal outside the
database (`bot.forget_journal`), so a restored backup cannot bring them back; 2. the
replayed version (skipped if already committed: the newest version is this request's,
and skipped if nothing of the member is kept: a forget that finds nothing writes no
version); 3. delete the member's episodes (their ids are the
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

Who `forget-user` names is resolved against the members the community has seen
(`resolve_member`), exactly: a mention or id, a name they spoke under, a terminal name.
None or several is a refusal; nothing is ever matched by a part of a name or an id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from bot.forget_journal import ForgetJournal
from sonality.agent import SonalityAgent
from sonality.memory.episodes import document_of
from sonality.store import SEMANTIC
from storage import Database
from storage.forget import ForgetRequest, JournalEntry, KnownMember

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
    journal: ForgetJournal | None = None,
) -> ForgetRequest:
    """Forget `member_id` in `community_id`; returns the finished request (with the
    pseudonym, and the forget-me version: None when nothing of the member was kept)."""
    request = await db.begin_forget(
        community_id, member_id, requested_by, reason, datetime.now(UTC)
    )
    return await finish_forget(db, agent, request, journal)


async def finish_forget(
    db: Database,
    agent: SonalityAgent,
    request: ForgetRequest,
    journal: ForgetJournal | None = None,
) -> ForgetRequest:
    member = request.member_id
    if member is None:
        return request
    current = await db.forget_request(request.id)
    if current is not None and current.member_id is None:
        # Finished meanwhile by another process: finishing it again would replay and
        # erase what the member said after it.
        return current
    cid = request.community_id
    # A message of theirs may be being learned right now (past the check that skips a
    # member being forgotten): read their words only once that commit is in.
    await agent.stop_learning(members=(member,))
    words = await db.member_words(cid, member)
    kept = await db.keeps_member(cid, member)
    if kept and journal is not None and request.member_key and request.started_at:
        entry = JournalEntry(
            pseudonym=request.pseudonym, key=request.member_key, at=request.started_at
        )
        await journal.record([entry], "would not forget this member again")
    version = request.version

    # Chroma first: the interaction and evidence rows, which hold the episode ids, and
    # the audit rows, which hold the insights drawn from the member's messages, go in
    # erase_member.
    async def memories() -> list[str]:
        ids = await db.member_episode_ids(cid, member)
        return ids + await semantic_ids(db, agent, cid, words.texts)

    _step(2)
    deleted = False
    if version is None and kept:
        version = await committed_before_a_crash(db, cid, "forget-me", request.pseudonym)
        if version is None:
            # The memories go with the replay, before the agent is let go (a reflection
            # could read them otherwise).
            state = await agent.forget_member(
                member,
                actor=request.pseudonym,
                drop_insights=words.texts,
                drop_topics=words.topics,
                memories=memories,
            )
            version, deleted = state.version, True
        await db.set_forget_version(request.id, version)
    _step(3)
    if not deleted:
        await agent.forget_episodes(member, await memories())
    await db.erase_member(request, words, datetime.now(UTC))
    log.info(
        "%s: forgot a member as %s (%s)",
        cid,
        request.pseudonym,
        f"v{version}" if version is not None else "nothing was kept",
        extra={"community": cid},
    )
    return request.model_copy(update={"version": version, "member_id": None})


async def committed_before_a_crash(
    db: Database, community_id: str, cause: str, actor: str
) -> int | None:
    """The newest version when it is the one a journaled request (its `cause`, and its
    `actor`, unique to the request) committed before the process died, else None.
    Messages taken back together share one version whose actor lists each of them
    (`SonalityAgent.withdraw_message`)."""
    newest = await db.community(community_id).versions(limit=1)
    if newest and newest[0].cause == cause and actor in (newest[0].actor or "").split(", "):
        return newest[0].version
    return None


async def semantic_ids(
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
    """After a rollback to `target`: if a forget-me happened after it, or a message was
    taken back (deleted or edited), replay the opinions again so the restored state
    holds none of their influence. Returns whether it re-applied."""
    later = await db.forgets_after(community_id, target)
    deleted = await db.deletions_after(community_id, target)
    if not later and not deleted:
        return False
    what = " and ".join(w for w, y in (("forget-me", later), ("deleted messages", deleted)) if y)
    await agent.forget_member(
        None, actor="rollback", change=f"{what} re-applied after the rollback to v{target}"
    )
    return True


async def reapply_journal(db: Database, entries: Sequence[JournalEntry]) -> list[str]:
    """Journal again (unfinished) every forget-me of the file (`entries`) the database
    lacks: it was restored from a backup older than them. `resume_forgets` then
    finishes them. Returns their pseudonyms."""
    if not entries:
        return []
    known = await db.journal_pseudonyms()
    if all(e.pseudonym in known for e in entries):
        return []
    matched = await db.rejournal(entries, datetime.now(UTC))
    for pseudonym in matched:
        log.warning(
            "the database lacked the forget-me of %s (restored from before it): forgetting "
            "that member again",
            pseudonym,
        )
    return matched


async def resume_forgets(
    db: Database,
    agent_for: Callable[[str], Awaitable[SonalityAgent]],
    journal: ForgetJournal | None = None,
    *,
    started_before: datetime | None = None,
) -> list[ForgetRequest]:
    """Finish every forget-me a crash interrupted or a restore journaled again (run on
    start, before any message of the community is learned); returns the requests
    finished. With `started_before`, only those begun before then (the housekeeping's
    sweep, for one left by a process that died and was not started again)."""
    done = []
    for request in await db.open_forgets():
        if started_before is not None and (
            request.started_at is None or request.started_at >= started_before
        ):
            continue
        log.warning(
            "%s: finishing an interrupted forget-me (%s)",
            request.community_id,
            request.pseudonym,
            extra={"community": request.community_id},
        )
        done.append(
            await finish_forget(db, await agent_for(request.community_id), request, journal)
        )
    return done


# ------------------------------------------------------------------ forget-user's target

#: A platform mention: Discord `<@123>` / `<@!123>`, Slack `<@U123>` / `<@U123|name>`.
_MENTION = re.compile(r"<@!?([A-Za-z0-9_.-]+)(?:\|[^>]*)?>")


@dataclass(frozen=True)
class Target:
    """What `forget-user`'s words name: one member, or why not, and the reason given."""

    member: KnownMember | None
    reason: str
    named: str
    candidates: tuple[KnownMember, ...] = ()


def resolve_member(members: Sequence[KnownMember], words: Sequence[str]) -> Target:
    """The member `words` start with, and the rest of the line as the reason.

    Matched exactly: a mention (`<@U2|bob>`, `<@123>`), or a first word that is a
    member's id (what Discord's member picker sends; an id wins over any name); else a
    name the member spoke under (case aside, an `@` before it allowed) or a terminal
    name (the adapter's `terminal-<name>`), of one word or several. When the line's
    start reads as the names of different members ("Bob" and "Bob asked"), or one name
    is several members', `member` is None and `candidates` lists them: the reason must
    never decide who is forgotten."""
    text = " ".join(w for w in words if w).strip()
    mention = _MENTION.match(text)
    if mention is not None:
        found = [m for m in members if m.id == mention.group(1)]
        rest = text[mention.end() :].strip()
        return Target(found[0] if found else None, rest, mention.group(0))
    parts = text.split()
    if not parts:
        return Target(None, "", "")
    by_id = [m for m in members if m.id == parts[0].removeprefix("@")]
    if by_id:
        return Target(by_id[0], " ".join(parts[1:]), parts[0])
    matches = [(size, _named(members, " ".join(parts[:size]))) for size in range(len(parts), 0, -1)]
    matches = [(size, found) for size, found in matches if found]
    if not matches:
        return Target(None, " ".join(parts[1:]), parts[0])
    size, found = matches[0]  # the longest name that matches
    named, rest = " ".join(parts[:size]), " ".join(parts[size:])
    every = {m.id: m for _, more in matches for m in more}
    if len(every) > 1:
        return Target(None, rest, named, tuple(every.values()))
    return Target(found[0], rest, named)


def _named(members: Sequence[KnownMember], named: str) -> list[KnownMember]:
    bare = named.removeprefix("@").strip()
    if not bare:
        return []
    by_id = [m for m in members if m.id == bare]
    if by_id:
        return by_id
    folded = bare.casefold()
    by_name = [m for m in members if m.name and m.name.casefold() == folded]
    if by_name:
        return by_name
    terminal = "terminal-" + "-".join(bare.lower().split())
    return [m for m in members if m.id == terminal]
