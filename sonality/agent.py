"""One community's personality: reply with one LLM call, learn afterwards, in order.

`respond()` records the interaction in the store's outbox and returns; the learning
queue then runs `_post_process` (seed stages 3-6) on a copy of the state and commits it
as one transaction. Every change takes the agent's lock, so one community's changes are
strictly ordered while other communities never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from sonality.changes import (
    decay_step,
    describe_interaction,
    describe_reflection,
    ess_event,
    message_step,
    reflection_event,
)
from sonality.config import (
    BELIEF_DECAY_RATE,
    RESPONSE_MAX_TOKENS,
    EngineConfig,
    or_environment,
)
from sonality.ess import ESSResult, classify, wordless_ess
from sonality.evidence import ROLLBACK, EvidenceStep
from sonality.learning import LearningQueue
from sonality.llm import ChatTurn, ImagePart, LLMClient, LLMError, TextSink
from sonality.memory.access import AgentMemory, DirectMemory
from sonality.memory.episodes import EpisodeMemory
from sonality.memory.updater import extract_insight
from sonality.opinions import (
    apply_due,
    disagrees,
    structured_traits,
    update_opinions,
    update_topics,
    views_for_ess,
)
from sonality.prompts import (
    build_message_turn,
    build_messages,
    build_system_blocks,
    member_words,
    noted_images,
    with_image_note,
)
from sonality.reflection import (
    RECENT_EPISODES_FOR_REFLECTION,
    ReflectionOutcome,
    cumulative_shift,
    rewrite,
    trigger,
)
from sonality.replay import collection_paused, forgotten, release_in_slices
from sonality.rollback import RollbackError, restore
from sonality.state import SpongeState
from sonality.store import (
    EPISODIC,
    AuditEvent,
    BeingErased,
    Episode,
    InteractionRecord,
    Speaker,
    StateCommit,
    StateStore,
    UsageRecord,
    utcnow,
)

__all__ = ["ReflectionOutcome", "RollbackError", "SonalityAgent", "cumulative_shift"]

log = logging.getLogger(__name__)

ANONYMOUS = Speaker(id="anonymous", name="someone")

#: How long a change outside learning waits for another process's lease, and how often it asks.
LEASE_WAIT_SECONDS = 120.0
LEASE_POLL_SECONDS = 0.2

#: A withdrawal's replay is followed by a pause this many times as long (at most
#: `WITHDRAWAL_PAUSE_LIMIT` seconds) before the next one starts: messages deleted
#: meanwhile wait and are taken back together. Without it, a member deleting old
#: messages one at a time, each just after the last replay, kept a core replaying a
#: long log; with it, a community's replays take at most a quarter of the time.
WITHDRAWAL_PAUSE_FACTOR = 3.0
WITHDRAWAL_PAUSE_LIMIT = 60.0
#: And none starts until this long has passed since the last message was withdrawn:
#: the messages of a bulk delete, handed over one journal row after another, arrive
#: a few milliseconds apart and are taken back in one replay, not the first alone.
WITHDRAWAL_GATHER_SECONDS = 0.1
#: ... but no longer than this after the first of them came, or a member deleting a
#: message every 0.09 s could put off every replay of the community for as long as
#: they have messages.
WITHDRAWAL_GATHER_LIMIT = 1.0


class SonalityAgent:
    """The personality of one community (seed: `SonalityAgent`)."""

    # The seed's step names, for code written against its API.
    _update_topics = staticmethod(update_topics)
    _update_opinions = staticmethod(update_opinions)
    _build_structured_traits = staticmethod(structured_traits)

    def __init__(
        self,
        *,
        client: LLMClient,
        store: StateStore,
        episodes: EpisodeMemory | AgentMemory,
        sponge: SpongeState,
        model: str | None = None,
        ess_model: str | None = None,
        label: str = "",
        config: EngineConfig | None = None,
    ) -> None:
        """`config`: this agent's tunables for its whole life (the environment's when
        none is given); `model` and `ess_model`, when given, win over its models."""
        self.config = or_environment(config)
        self.label = label or "community"
        self.client = client
        self.store = store
        # A plain store is written after each commit; a host may bring its own AgentMemory.
        self.memory: AgentMemory = (
            episodes
            if isinstance(episodes, AgentMemory)
            else DirectMemory(episodes, self.label, config=self.config)
        )
        self.episodes = self.memory.episodes
        self.sponge = sponge
        self.model = model or self.config.model
        self.ess_model = ess_model or self.config.ess_model
        # The latest exchange (seed attribute); per-user history is the host's.
        self.conversation: list[dict[str, str]] = []
        self.last_ess: ESSResult | None = None
        # Whose rating `last_ess` is (interaction id, speaker): a forget-me of the
        # speaker, or taking the message back, takes it away too (`_replayed`).
        self._last_ess_of: tuple[str, str] | None = None
        self.previous_snapshot: str | None = None
        self._lock = asyncio.Lock()
        # Members this process forgot: a queued message of theirs is learned only if the
        # store still holds it as pending (the forget-me deleted the ones sent before it).
        self._forgotten: set[str] = set()
        # Messages withdrawn here (deleted or edited by their author): never learned.
        self._withdrawn: set[str] = set()
        # Members forgotten here, and the version that forgot them (`_replayed`).
        self._forgot_at: dict[str, int] = {}
        # Withdrawals waiting for the agent, taken back together (`withdraw_message`).
        self._withdrawals: list[Withdrawal] = []
        # When the next of them may start (`time.monotonic`, `WITHDRAWAL_PAUSE_FACTOR`).
        self._withdrawals_resume_at = 0.0
        # Memory ids waiting to be deleted together (`forget_episodes`).
        self._unforgotten_ids: set[str] = set()
        self._forgetting = asyncio.Lock()
        self._lease = store.learning_lease()
        self.learning = LearningQueue(
            self._post_process,
            lock=self._lock,
            store=store,
            skip=self._forgotten_record,
            label=self.label,
            lease=self._lease,
            catch_up=lambda: self.catch_up(adopt_episodes=True),
        )
        # The newest version whose episodes this agent wrote or took over.
        self._episodes_seen = sponge.version
        # The ESS of the interaction whose learning waits, so a retry does not pay twice.
        self._classified: tuple[str, ESSResult] | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def load(
        cls,
        *,
        client: LLMClient,
        store: StateStore,
        episodes: EpisodeMemory | AgentMemory,
        model: str | None = None,
        ess_model: str | None = None,
        label: str = "",
        config: EngineConfig | None = None,
    ) -> SonalityAgent:
        """Open a community at its latest version (the seed if new) and queue the
        interactions a crash left unlearned, before anything new."""
        state = await store.latest_state()
        if state is None:
            state = SpongeState()
            try:
                await store.commit(
                    StateCommit(state=state, cause="seed", change="seed personality")
                )
            except Exception:
                # Another process seeded it first.
                state = await store.latest_state()
                if state is None:
                    raise
        agent = cls(
            client=client,
            store=store,
            episodes=episodes,
            sponge=state,
            model=model,
            ess_model=ess_model,
            label=label,
            config=config,
        )
        await agent.memory.start(await store.pending_episodes(), store.mark_episodes_written)
        pending = await store.pending_interactions()
        if pending:
            log.info("%s: replaying %d unfinished interaction(s)", agent.label, len(pending))
            agent.learning.wake()
        return agent

    # ------------------------------------------------------------------ shared store
    async def catch_up(self, adopt_episodes: bool = False) -> bool:
        """Adopt a newer state another process committed (True if one was); a host calls
        it before reading this one. A store whose lease nobody else shares holds nothing
        newer than this agent: that is answered without asking it.

        `adopt_episodes`: also write the episodes still in the store's episode outbox,
        which a process killed after its commit may have left.
        """
        if not self._lease.shared or (latest := await self.store.latest_version()) is None:
            return False
        moved = False
        if latest > self.sponge.version:
            state = await self.store.latest_state()
            if state is not None and state.version > self.sponge.version:
                log.debug("%s: adopting v%d from another process", self.label, state.version)
                self.sponge = state
                moved = True
        if adopt_episodes and latest > self._episodes_seen:
            # The other processes' waiting episodes too: one of them may have died with
            # its queue. The memory queues each episode once (one already queued is
            # left as it is), and writes it only if no process has meanwhile.
            self._episodes_seen = latest
            await self.memory.write(await self.store.pending_episodes())
        return moved

    async def wake_learning(self) -> None:
        """Look at the outbox now (for rows a dead process left)."""
        self.learning.wake()

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """The community's lease (no other holder learns meanwhile), the agent's lock,
        and the latest state."""
        lease = self._lease
        waited = 0.0
        while not await lease.acquire():
            if waited >= LEASE_WAIT_SECONDS:
                raise RuntimeError(
                    f"{self.label}: another process kept learning for {waited:.0f}s; try again"
                )
            await asyncio.sleep(LEASE_POLL_SECONDS)
            waited += LEASE_POLL_SECONDS
        try:
            async with self._lock:
                await self.catch_up()
                yield
        finally:
            await lease.release()

    async def drain(self) -> None:
        """Wait until queued learning is done (or held for the model) and its memories
        are written."""
        await self.learning.settled()
        await self.memory.flush()

    async def flush_episodes(self) -> None:
        await self.memory.flush()

    @property
    def learning_held(self) -> bool:
        return self.learning.held

    def resume_learning(self) -> None:
        self.learning.resume()

    @property
    def backlog(self) -> int:
        return self.learning.backlog

    async def close(self, grace_seconds: float = 10.0) -> None:
        """Finish queued work within the grace; the rest is replayed on next load."""
        self._closed = True
        await self.learning.close(grace_seconds)
        await self.memory.close(grace_seconds)

    # ------------------------------------------------------------------ reply path
    async def respond(
        self,
        user_message: str,
        speaker: Speaker | None = None,
        conversation: Sequence[ChatTurn] | Awaitable[Sequence[ChatTurn]] = (),
        on_text: TextSink | None = None,
        images: Sequence[ImagePart] = (),
        message_ref: str = "",
        *,
        learn: bool = True,
        asked_at: datetime | None = None,
    ) -> str:
        """Answer one message with one LLM call and queue it for learning.

        `conversation` may be an awaitable, so the host's read overlaps retrieval.
        `on_text` gets the reply as it streams. `images` go to the model with the
        message and are never kept: the record notes only how many there were, and
        learning rates the words alone. `message_ref` is the host's id of the message
        (kept with the record, see `InteractionRecord.message_ref`). With `learn` off
        the message is answered and forgotten: no outbox row, no ESS, no memory; only
        the reply's tokens are kept. Raises `LLMError` when there is no whole reply;
        nothing is recorded then. `asked_at` is when the message arrived (now, if not
        given): a forget-me of the speaker, or a deletion of the message, from then on
        refuses the record, so a host that did work before calling (fetching pictures)
        passes the time it began.
        """
        if self._closed:
            raise RuntimeError("agent is closed")
        asked_at = asked_at or utcnow()
        speaker = speaker or ANONYMOUS
        user_message = with_image_note(user_message, len(images))
        hidden = self.sponge.hidden_ranges
        waits: list[Awaitable[Any]] = [self.memory.recall(user_message, hidden)]
        waits.append(conversation if inspect.isawaitable(conversation) else _ready(conversation))
        if not self._lock.locked():
            # Another process may have learned since (or a moderator rolled back there).
            # The check overlaps retrieval; a rollback adopted by it is recalled anew.
            waits.append(self.catch_up())
        memories, history, *_ = await asyncio.gather(*waits)
        if self.sponge.hidden_ranges != hidden:
            memories = await self.memory.recall(user_message, self.sponge.hidden_ranges)
        traits = structured_traits(self.sponge)
        turn = build_message_turn(user_message, speaker.name, memories, traits)
        result = await self.client.reply(
            system=build_system_blocks(self.sponge.snapshot),
            messages=build_messages(history, turn, images),
            max_tokens=RESPONSE_MAX_TOKENS,
            model=self.model,
            purpose="reply",
            on_text=on_text,
        )
        reply = result.text.strip()
        if not reply:
            raise LLMError("the model returned an empty answer")
        if not learn:
            usage = UsageRecord(
                purpose="reply", model=result.model, usage=result.usage, created_at=asked_at
            )
            await self.store.record_usage([usage])
            return reply
        record = InteractionRecord(
            id=uuid.uuid4().hex,
            speaker=speaker,
            message=user_message,
            reply=reply,
            created_at=asked_at,
            model=result.model,
            reply_usage=result.usage,
            message_ref=message_ref,
        )
        if not await self.store.record_interaction(record):
            # The speaker ran forget-me, or deleted the message, while this reply was
            # being written: the reply goes out, but nothing of the message is kept.
            log.info(
                "%s: %s was forgotten or deleted during the reply; not recorded",
                self.label,
                record.id,
            )
            return reply
        self.conversation = [
            {"role": "user", "content": user_message},
            {"role": "assistant", "content": reply},
        ]
        self.learning.wake()
        return reply

    # ------------------------------------------------------------------ post-processing
    async def _post_process(self, record: InteractionRecord, usage: list[UsageRecord]) -> None:
        """Seed stages 3-6 for one interaction, committed as one new version; `usage`
        collects the tokens spent, recorded even if the attempt fails."""
        state = self.sponge.model_copy(deep=True)
        version = self.sponge.version + 1  # the version this commit creates
        ess = await self._classify_ess(record, views_for_ess(state), usage)
        state.interaction_count += 1
        episodes = [
            Episode(
                id=record.id,  # the interaction id: a replay overwrites, never duplicates
                user_message=record.message,
                agent_response=record.reply,
                ess_score=ess.score,
                topics=ess.topics,
                # The summary rates the words; the memory also keeps that images came.
                summary=" ".join(filter(None, (ess.summary, noted_images(record.message)))),
                interaction=state.interaction_count,
                version=version,
            )
        ]
        update_topics(state, ess, config=self.config)
        disagreed = disagrees(state, ess)
        committed = apply_due(state)
        staged = update_opinions(
            state,
            ess,
            interaction_id=record.id,
            member=record.speaker.id,
            version=version,
            config=self.config,
        )
        state.track_disagreement(disagreed)
        insight = await self._extract_insight(ess, record, usage)
        if insight:
            state.pending_insights.append(insight)
        did = {"staged": staged, "committed": committed, "disagreed": disagreed, "insight": insight}
        events = [ess_event(state, record, ess, **did)]
        outcome = await self._maybe_reflect(state, usage, events, episodes)
        evidence = [message_step(state, record, ess)]
        if outcome is not None:  # every reflection starts with the decay step
            evidence.append(decay_step(state))
        change = describe_interaction(ess, staged, committed, insight, outcome)
        await self._commit(
            state,
            cause="interaction",
            change=change,
            events=events,
            usage=usage,
            episodes=episodes,
            interaction_id=record.id,
            evidence=evidence,
        )
        self.last_ess, self._last_ess_of = ess, (record.id, record.speaker.id)
        if committed:
            self._log_change(f"opinion moved (v{state.version}): {'; '.join(committed)}")
        if outcome is not None:
            self._log_change(f"{describe_reflection(outcome)} (v{state.version})")

    async def _classify_ess(
        self, record: InteractionRecord, views: str, usage: list[UsageRecord]
    ) -> ESSResult:
        """ESS of the user's words alone, cached per interaction so a retry pays once.
        A message of pictures without words is not rated: there is nothing to judge.

        `LLMError` propagates: an outage is retried, never scored as "no argument".
        """
        if self._classified is not None and self._classified[0] == record.id:
            return self._classified[1]
        words = member_words(record.message)
        if not words.strip():
            return wordless_ess()
        ess = await classify(self.client, words, views, model=self.ess_model, usage_sink=usage)
        self._classified = (record.id, ess)
        return ess

    async def _extract_insight(
        self, ess: ESSResult, record: InteractionRecord, usage: list[UsageRecord]
    ) -> str | None:
        if ess.score <= self.config.ess_threshold:
            return None
        return await extract_insight(
            self.client, ess, record.message, record.reply, model=self.ess_model, usage_sink=usage
        )

    async def _commit(
        self, state: SpongeState, *, episodes: Sequence[Episode] = (), **commit: Any
    ) -> None:
        """Commit `state` as the next version, make it current, then write its episodes."""
        prepared = await self.memory.prepare(list(episodes))
        state.version = self.sponge.version + 1
        await self.store.commit(StateCommit(state=state, episodes=prepared, **commit))
        self._episodes_seen = max(self._episodes_seen, state.version)
        if state.snapshot != self.sponge.snapshot:
            self.previous_snapshot = self.sponge.snapshot
        self.sponge = state
        await self.memory.write(prepared)

    def _log_change(self, message: str) -> None:
        log.info("%s: %s", self.label, message, extra={"community": self.label})

    # ------------------------------------------------------------------ reflection
    async def _maybe_reflect(
        self,
        state: SpongeState,
        usage: list[UsageRecord],
        events: list[AuditEvent],
        episodes: list[Episode],
    ) -> ReflectionOutcome | None:
        reason = trigger(state, config=self.config)
        if reason is None:
            return None
        return await self._reflect(state, usage, events, reason, episodes)

    async def _reflect(
        self,
        state: SpongeState,
        usage: list[UsageRecord],
        events: list[AuditEvent],
        reason: str,
        episodes: list[Episode],
    ) -> ReflectionOutcome:
        """Decay, then rewrite the narrative; new insight memories go into `episodes`."""
        dropped = tuple(state.decay_beliefs(BELIEF_DECAY_RATE))
        await self.memory.flush()
        recent = await asyncio.to_thread(
            self.episodes.recent_summaries,
            state.last_reflection_at,
            RECENT_EPISODES_FOR_REFLECTION,
            state.hidden_ranges,
        )
        recent = [*recent, *(e.summary for e in episodes if e.memory_type == EPISODIC)]
        outcome = await rewrite(
            self.client,
            self.ess_model,
            state,
            recent[-RECENT_EPISODES_FOR_REFLECTION:],
            reason=reason,
            dropped=dropped,
            version=self.sponge.version + 1,
            usage=usage,
            episodes=episodes,
            label=self.label,
        )
        events.append(reflection_event(state, outcome))
        return outcome

    async def reflect_now(self, trigger: str, actor: str | None = None) -> ReflectionOutcome:
        """Reflect outside the message flow (scheduler, `/sonality reflect`)."""
        async with self._changing():
            state = self.sponge.model_copy(deep=True)
            usage: list[UsageRecord] = []
            events: list[AuditEvent] = []
            episodes: list[Episode] = []
            outcome = await self._reflect(state, usage, events, trigger, episodes)
            if not outcome.ran and not outcome.dropped_beliefs:
                return outcome
            await self._commit(
                state,
                cause="reflection",
                change=describe_reflection(outcome),
                events=events,
                usage=usage,
                episodes=episodes,
                actor=actor,
                evidence=[decay_step(state)],
            )
            self._log_change(f"{describe_reflection(outcome)} (v{state.version})")
            return outcome

    # ------------------------------------------------------------------ undoing
    async def rollback(self, version: int, actor: str, reason: str = "") -> SpongeState:
        """Restore `version` as a new version, hiding the memories formed since."""
        async with self._changing():
            target = await self.store.state_at(version)
            if target is None or version > self.sponge.version:
                raise RollbackError(f"there is no version {version}")
            restored = restore(target, self.sponge)
            at = restored.interaction_count
            await self._commit(
                restored,
                cause="rollback",
                change=f"rollback to v{version}" + (f": {reason}" if reason else ""),
                events=[
                    AuditEvent(
                        kind="rollback",
                        interaction=at,
                        payload={"to_version": version, "actor": actor, "reason": reason},
                    )
                ],
                actor=actor,
                evidence=[EvidenceStep(kind=ROLLBACK, interaction=at, target_version=version)],
            )
            return restored

    async def _forgotten_record(self, record: InteractionRecord) -> bool:
        """Whether a queued message is not to be learned (asked under the agent's lock):
        it was withdrawn (deleted or edited by its author), or its speaker was forgotten
        here and the store no longer holds it as pending (the forget-me deleted it, or
        is about to: see `pending_interactions`). A member's messages after their
        forget-me are learned as any other."""
        if record.id in self._withdrawn:
            return True
        if record.speaker.id not in self._forgotten:
            return False
        return all(r.id != record.id for r in await self.store.pending_interactions())

    async def stop_learning(
        self, *, members: Collection[str] = (), interactions: Collection[str] = ()
    ) -> None:
        """Never learn the messages of `members` (being forgotten) recorded before now,
        nor the messages `interactions` (their author deleted or edited them), and
        return once no learning of one is under way: one that had already passed its
        `skip` check holds the agent's lock (or, on a shared store, another process the
        lease) until it commits, so what it wrote (the message's summary, insight and
        topics) is in the store when this returns, for the caller to read and take back."""
        self._forgotten.update(members)
        self._withdrawn.update(interactions)
        async with self._changing():
            pass

    async def forget_episodes(self, member: str | None, ids: Collection[str]) -> None:
        """Delete a forgotten member's (or a withdrawn message's) memories by id, unwritten
        ones too. Ids not stored are ignored, so a resumed forget-me can run it again;
        their episode outbox rows go with the store's erase."""
        if member is not None:
            self._forgotten.add(member)
        # Each delete may cost a whole save of the index and a rebuild of Chroma's file,
        # and a purge finishes dozens of deletions at once: the ids that arrive while a
        # delete runs wait, and the first of their callers deletes them all in one go.
        # A caller whose ids went with another's returns once that delete has ended.
        self._unforgotten_ids.update(ids)
        async with self._forgetting:
            batch, self._unforgotten_ids = self._unforgotten_ids, set()
            if not batch:
                return
            try:
                await self.memory.forget(batch)
            except BaseException:
                self._unforgotten_ids |= batch  # the next caller tries them again
                raise

    async def forget_member(
        self,
        member: str | None,
        *,
        actor: str,
        drop_insights: Collection[str] = (),
        drop_topics: Collection[str] = (),
        change: str = "forget-me: opinions replayed without one member",
        memories: MemoryIds | None = None,
    ) -> SpongeState:
        """Undo a member's influence: a new version in which everything the evidence log
        derives is replayed from the seed without their messages
        (`sonality.replay.forgotten`); `drop_insights` and `drop_topics` are their words.

        Messages of the member recorded before this are never learned (the store's
        journal holds them back until the forget-me deletes them). `member` None replays
        the log as it stands: after a rollback to a version from before a forget-me, the
        log (which no longer holds the forgotten member's messages) gives the restored
        state without their influence.

        `memories`, if given, names the member's memories once the new version is in,
        and they are deleted before the agent is let go: a reflection in between would
        read their summaries and fold them into the narrative and new insights.
        """
        without = () if member is None else (member,)
        self._forgotten.update(without)
        async with self._changing():
            state = await self._replayed(
                cause="forget-me",
                actor=actor,
                change=change,
                without_members=without,
                drop_insights=drop_insights,
                drop_topics=drop_topics,
            )
            self._forgot_at.update(dict.fromkeys(without, state.version))
            if memories is not None:
                await self.forget_episodes(member, await memories())
            return state

    async def withdraw_message(
        self,
        interaction_id: str,
        *,
        actor: str,
        change: str,
        drop_insights: Collection[str] = (),
        drop_topics: Collection[str] = (),
        words: MessageWords | None = None,
        memories: MemoryIds | None = None,
    ) -> SpongeState | None:
        """Undo one message's influence (its author deleted or edited it): a new version
        replayed from the seed without it, as `forget_member` does for a member. None
        (no version) when nothing was learned from it; it never will be now. `words`,
        if given, is asked for more insights and topics to drop once no learning of the
        message is under way (what that learning wrote is then in the store), as
        `stop_learning` would wait for; the call returns after such a moment too.
        `memories`, if given, names the message's memories once the replay is in: they
        are deleted before the agent is let go, as `forget_member` does, when the call
        returns a version.

        Messages withdrawn within a moment of each other (a bulk delete), while another
        change holds the agent, or in the pause after the last withdrawal's replay (a
        member deleting their history one message at a time; see
        `WITHDRAWAL_PAUSE_FACTOR` and `WITHDRAWAL_GATHER_SECONDS`) are taken back together
        by whichever of their calls runs next: one replay and one version for all of
        them (its actor lists every one), where one each would replay a long log once
        per message. Each call returns that version, or None if nothing was learned from
        its own message."""
        self._withdrawn.add(interaction_id)
        mine = Withdrawal(
            interaction_id=interaction_id,
            actor=actor,
            change=change,
            drop_insights=tuple(drop_insights),
            drop_topics=tuple(drop_topics),
            words=words,
            memories=memories,
        )
        self._withdrawals.append(mine)
        while not mine.done:
            if (wait := self._withdrawal_wait()) > 0:
                await asyncio.sleep(wait)  # those withdrawn meanwhile join
                continue
            async with self._changing():
                if mine.done or self._withdrawal_wait() > 0:
                    continue  # taken back by another call, or a replay just ended
                batch, self._withdrawals = self._withdrawals, []
                started = time.monotonic()
                try:
                    await self._withdraw_together(batch)
                except BaseException:
                    # The others are left to their own calls, which try again.
                    self._withdrawals[:0] = [w for w in batch if w is not mine]
                    raise
                finally:
                    ended = time.monotonic()
                    self._withdrawals_resume_at = ended + min(
                        WITHDRAWAL_PAUSE_FACTOR * (ended - started), WITHDRAWAL_PAUSE_LIMIT
                    )
        return mine.state

    def _withdrawal_wait(self) -> float:
        """Seconds until waiting withdrawals may be replayed: the pause after the last
        replay, and the gathering time after the newest waiting one (within its limit
        after the oldest)."""
        until = self._withdrawals_resume_at
        if waiting := self._withdrawals:
            gathered = min(
                waiting[-1].arrived + WITHDRAWAL_GATHER_SECONDS,
                waiting[0].arrived + WITHDRAWAL_GATHER_LIMIT,
            )
            until = max(until, gathered)
        return until - time.monotonic()

    async def _withdraw_together(self, batch: Sequence[Withdrawal]) -> None:
        """One replay without every message of `batch` that was learned from, from the
        state before the earliest of them when that is safe (see `_replayed`)."""
        for withdrawal in batch:
            if withdrawal.words is not None:
                insights, topics = await withdrawal.words()
                withdrawal.drop_insights += tuple(insights)
                withdrawal.drop_topics += tuple(topics)
                withdrawal.words = None
        learned = [await self.store.learned_at(w.interaction_id) for w in batch]
        taken = [(w, at) for w, at in zip(batch, learned, strict=True) if at is not None]
        state = None
        if taken:
            first, more = taken[0][0], len(taken) - 1
            state = await self._replayed(
                first_learned=min(at for _, at in taken),
                cause="message-deleted",
                actor=", ".join(w.actor for w, _ in taken),
                change=first.change
                + (f" (and {more} more taken back in the same replay)" if more else ""),
                without_interactions=[w.interaction_id for w, _ in taken],
                drop_insights=sorted({t for w, _ in taken for t in w.drop_insights}),
                drop_topics=sorted({t for w, _ in taken for t in w.drop_topics}),
            )
        # Their memories go before the agent is let go: a reflection would read them.
        ids = [i for w, _ in taken if w.memories is not None for i in await w.memories()]
        if ids:
            await self.forget_episodes(None, ids)
        for withdrawal, at in zip(batch, learned, strict=True):
            withdrawal.state = None if at is None else state
            withdrawal.done = True

    async def _replayed(
        self,
        *,
        first_learned: int | None = None,
        cause: str,
        actor: str,
        change: str,
        without_members: Collection[str] = (),
        without_interactions: Collection[str] = (),
        drop_insights: Collection[str] = (),
        drop_topics: Collection[str] = (),
    ) -> SpongeState:
        """Commit the version `sonality.replay.forgotten` gives from the evidence log
        (under `_changing`). `first_learned` is the version that learned the earliest
        message taken back, if messages are.

        A message learned after the newest version in `REPLAYED_CAUSES` is taken back
        by replaying from the stored state just before it, not from the first message:
        a member posting and deleting in a long-lived community then costs the steps
        since their message, not the whole log. Before that version the stored states
        may hold influence the log no longer has (a forgotten member's, say), so an
        older message replays the whole log.

        The log is parsed in the store's thread and replayed in a worker thread: on a
        long log that takes seconds of CPU, which on the event loop would hold up every
        reply the process is writing. The garbage collector is paused meanwhile
        (`collection_paused`), so its full collections do not hold them up either, and
        the parsed log is freed a slice at a time (`release_in_slices`)."""
        with collection_paused():
            seed: SpongeState | None = None
            since = 0
            first = first_learned
            if first is not None and first > await self.store.last_version_of(REPLAYED_CAUSES):
                seed = await self.store.state_at(first - 1)
                since = 0 if seed is None else first
            steps = await self.store.evidence(since)
            # Taken back before, here or by another process, but maybe not yet erased
            # from the log (the host erases once the replay's version is in): left
            # out, or this replay would bring their influence back.
            erasing = await self.store.being_erased()
            earlier = (self._withdrawn | erasing.interactions).difference(without_interactions)
            forgot = {
                member: version
                for member, version in _forget_versions(erasing, self._forgot_at).items()
                if member not in without_members
            }
            current = self.sponge
            try:
                state, moved = await asyncio.to_thread(
                    lambda: forgotten(
                        _erased(steps, earlier, forgot),
                        current,
                        without_members,
                        drop_insights,
                        drop_topics,
                        without_interactions=without_interactions,
                        config=self.config,
                        seed=seed,
                    )
                )
            finally:
                await asyncio.to_thread(release_in_slices, steps)
        change += f"; changed: {', '.join(moved)}" if moved else "; no opinion changed"
        if self._last_ess_of is not None and (
            self._last_ess_of[0] in without_interactions or self._last_ess_of[1] in without_members
        ):
            self.last_ess = self._last_ess_of = None
        await self._commit(
            state,
            cause=cause,
            change=change,
            events=[
                AuditEvent(
                    kind=cause,
                    interaction=state.interaction_count,
                    payload={"actor": actor, "changed": moved},
                )
            ],
            actor=actor,
        )
        return state


def _forget_versions(erasing: BeingErased, here: dict[str, int]) -> dict[str, float]:
    """Each member being forgotten and the version that forgot them: the store's, else
    this process's, else infinity (the forget-me has not replayed yet: all of theirs)."""
    versions: dict[str, float] = {**dict.fromkeys(erasing.members, math.inf), **here}
    versions.update({m: v for m, v in erasing.members.items() if v is not None})
    return versions


def _erased(
    steps: list[EvidenceStep], interactions: Collection[str], members: dict[str, float]
) -> list[EvidenceStep]:
    """`steps` as the log will read once the erases under way are done: without the
    messages `interactions`, nor those learned from a member before the version that
    forgot them (`members`; what they said since is learned as anyone's). `steps`
    itself when nothing is left out (the usual case: no copy of a long log)."""
    if not interactions and not members:
        return steps
    return [
        s
        for s in steps
        if s.interaction_id not in interactions
        and not (s.member in members and s.version < members[s.member])
    ]


#: What a withdrawn message left to drop besides its influence: its insights' texts and
#: its own topics, read from the host's records once its learning is over.
MessageWords = Callable[[], Awaitable[tuple[Collection[str], Collection[str]]]]
#: Names a message's (or member's) memories once its replay is in (`forget_member`).
MemoryIds = Callable[[], Awaitable[Collection[str]]]


class Withdrawal(BaseModel):
    """One message to take back, waiting for the agent; `state` once `done`."""

    interaction_id: str
    actor: str
    change: str
    drop_insights: tuple[str, ...]
    drop_topics: tuple[str, ...]
    words: MessageWords | None = None
    memories: MemoryIds | None = None
    #: When it was withdrawn (`time.monotonic`): the gathering time counts from it.
    arrived: float = Field(default_factory=time.monotonic)
    done: bool = False
    state: SpongeState | None = None


#: Causes of versions whose opinions were rebuilt from the log or restored from an
#: older state, not reached by learning on from the version before.
REPLAYED_CAUSES = frozenset({"forget-me", "message-deleted", "rollback"})


async def _ready(turns: Sequence[ChatTurn]) -> Sequence[ChatTurn]:
    return turns
