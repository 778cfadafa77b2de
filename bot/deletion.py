"""A deleted message takes its influence back; an edited one takes back its old words.

Why here (bot/): as `bot.forget_me` does for a member, this wires the engine (a new version
whose opinions are replayed without the message, `SonalityAgent.withdraw_message`) to
the store (the journal, deleting and redacting rows, `storage.deletion`), with the same
steps, each safe to run again: 1. the journal row (from then on no answer to the message
that was asked before is recorded, not even one being written now:
`storage.forgotten.deleted_since`), copied to the journal file outside the database
(`bot.forget_journal`), so a backup restored from before it takes it back again
(`reapply_deletions`); 2. the replayed version, recorded as "deleted by its
author" or "edited by its author" without any of its words (none when nothing was
learned from the message yet: it never will be, and a message nothing was kept of gets
no version at all); 3. its episode and the insights drawn from it leave Chroma and the
write-behind queue, then its rows are deleted and redacted with the journal row closed
in the same transaction. `resume_deletions` finishes, on start, whatever a crash
interrupted.

Who deleted it: neither Discord's MESSAGE_DELETE nor Slack's `message_deleted` says.
Only the author can delete their message, or a moderator (Discord: Manage Messages;
Slack: an admin where the workspace allows it), and either way the community no
longer shows it, so the bot stops learning from it too.

An edit is the author taking back what the message said and saying the new text: the
old text is taken back as a deletion is, and the adapter then hands the new text over
as a new message (answered and judged at the end of the conversation, not in the old
one's place, so the replay stays that of a community that heard the new text last).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime

from bot.forget_journal import ForgetJournal
from bot.forget_me import committed_before_a_crash, semantic_ids
from sonality.agent import SonalityAgent
from storage import Database
from storage.deletion import DeletionCause, DeletionEntry, MessageDeletion

log = logging.getLogger(__name__)

#: The version's change line (the topics that moved are added), with no word of it.
CHANGES: dict[DeletionCause, str] = {
    "deleted": "a message deleted by its author (or a moderator): opinions replayed without it",
    "edited": "a message edited by its author: opinions replayed without its earlier text",
}

AgentFor = Callable[[str], Awaitable[SonalityAgent]]


def message_ref(platform: str, message_id: str) -> str:
    """What an interaction keeps of the message it answered: the platform and the
    platform's id of it (unique on that platform, see `IncomingMessage.message_id`)."""
    return f"{platform}:{message_id}"


async def take_back(
    db: Database,
    agent_for: AgentFor,
    ref: str,
    cause: DeletionCause,
    *,
    community_id: str | None = None,
    journal: ForgetJournal | None = None,
) -> list[MessageDeletion]:
    """Take back every answer kept to the message `ref` (deleted or edited), in every
    community that kept one; `community_id` (where the platform says it was) is
    journaled even when nothing of it is kept yet, so an answer being written now is
    not recorded. Each one taken back is also noted in `journal`, the file outside the
    database, so a restored backup from before it takes it back again. Returns the
    deletions finished (none: nothing was kept)."""
    communities = set(await db.communities_holding(ref))
    if community_id is not None:
        communities.add(community_id)
    done = []
    for cid in sorted(communities):
        deletions = await db.begin_deletion(cid, ref, cause, datetime.now(UTC))
        if journal is not None and deletions:
            await journal.record(
                [
                    DeletionEntry(label=d.label, key=d.message_key, cause=d.cause, at=d.started_at)
                    for d in deletions
                ],
                "would bring this message back",
            )
        for deletion in deletions:
            done.append(await finish_deletion(db, await agent_for(cid), deletion))
    return done


async def reapply_deletions(db: Database, entries: Sequence[DeletionEntry]) -> list[str]:
    """Journal again (unfinished) every message taken back that the file lists
    (`entries`) and a restored database lacks; `resume_deletions` then finishes them.
    Their labels."""
    if not entries:
        return []
    matched = await db.rejournal_deletions(entries)
    for label in matched:
        log.warning(
            "the database lacked the deletion %s (restored from before it): taking that "
            "message back again",
            label,
        )
    return matched


async def finish_deletion(
    db: Database, agent: SonalityAgent, deletion: MessageDeletion
) -> MessageDeletion:
    """Steps 2 and 3 (see the module docstring) of one journaled deletion."""
    interaction_id = deletion.interaction_id
    if interaction_id is None:
        return deletion
    cid = deletion.community_id

    async def dropped() -> tuple[Collection[str], Collection[str]]:
        words = await db.message_words(cid, interaction_id)
        return words.texts, words.topics

    # Its learning may be waiting for the model right now (past the check that skips a
    # message being deleted): its words are read only once that commit is in, by the
    # withdrawal (which takes back messages deleted meanwhile in the same replay) or
    # after `stop_learning`.
    async def memories() -> list[str]:
        words = await db.message_words(cid, interaction_id)
        return [interaction_id, *await semantic_ids(db, agent, cid, words.texts)]

    version = deletion.version
    if version is None:
        version = await committed_before_a_crash(db, cid, "message-deleted", deletion.label)
    deleted = False
    if version is None:
        # Its memories go with the replay, before the agent is let go (a reflection
        # could read them otherwise).
        state = await agent.withdraw_message(
            interaction_id,
            actor=deletion.label,
            change=CHANGES[deletion.cause],
            words=dropped,
            memories=memories,
        )
        if state is not None:
            await db.set_deletion_version(deletion.id, state.version)
            version, deleted = state.version, True
    else:
        await agent.stop_learning(interactions=(interaction_id,))
        if deletion.version is None:
            await db.set_deletion_version(deletion.id, version)
    words = await db.message_words(cid, interaction_id)
    insights = await semantic_ids(db, agent, cid, words.texts)
    if not deleted:
        await agent.forget_episodes(None, [interaction_id, *insights])
    await db.erase_message(deletion, words, datetime.now(UTC), tuple(insights))
    log.info(
        "%s: took back a message its author %s (%s)",
        cid,
        deletion.cause,
        f"v{version}" if version is not None else "nothing was learned from it",
        extra={"community": cid},
    )
    return deletion.model_copy(update={"version": version, "interaction_id": None})


async def resume_deletions(
    db: Database, agent_for: AgentFor, *, started_before: datetime | None = None
) -> list[MessageDeletion]:
    """Finish every deletion a crash interrupted (run on start, before any message of
    the community is learned); returns those finished. A community's are handed over
    at once, so those still to replay share one replay (`withdraw_message`). With
    `started_before`, only those begun before then (as `resume_forgets`)."""
    by_community: dict[str, list[MessageDeletion]] = {}
    for deletion in await db.open_deletions():
        if started_before is not None and deletion.started_at >= started_before:
            continue
        log.warning(
            "%s: finishing an interrupted message deletion (%s)",
            deletion.community_id,
            deletion.label,
            extra={"community": deletion.community_id},
        )
        by_community.setdefault(deletion.community_id, []).append(deletion)
    done = []
    for cid, deletions in by_community.items():
        agent = await agent_for(cid)
        results = await asyncio.gather(
            *(finish_deletion(db, agent, d) for d in deletions), return_exceptions=True
        )
        done += [r for r in results if isinstance(r, MessageDeletion)]
        for result in results:
            if isinstance(result, BaseException):
                raise result  # start fails as it did; the rest of them are finished
    return done
