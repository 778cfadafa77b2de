"""One community's personality: reply fast, learn afterwards, in order, crash-safe.

The seed runs its whole pipeline synchronously inside `respond()`. In a chat community
that doubles the wait for every message, so this agent splits it:

* `respond()` does retrieval, prompt assembly and exactly one LLM call, durably records
  the interaction (the outbox row), queues it and returns the reply;
* a single worker per agent then runs ESS, episode storage, opinion staging,
  disagreement tracking, insight extraction and reflection on a *copy* of the state,
  and commits the new version, its audit events and the outbox acknowledgement through
  the `StateStore` in one transaction. A crash before that commit leaves the outbox row
  pending, and `load()` replays it before anything new.

All mutations (post-processing, reflection, rollback) take the agent's lock, so one
community's changes are strictly ordered while other communities never wait on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import inspect
import logging
import uuid
from collections.abc import Awaitable, Collection, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from sonality import config
from sonality.ess import ESSResult, classify
from sonality.evidence import DECAY, MESSAGE, ROLLBACK, EvidenceStep, RecordedESS
from sonality.llm import ChatTurn, LLMClient, LLMError, SystemBlock, TextSink
from sonality.memory.embed_lane import EmbeddingLane
from sonality.memory.episodes import EpisodeMemory, document_of
from sonality.memory.sponge import HiddenMemories, SpongeState
from sonality.memory.updater import (
    SNAPSHOT_CHAR_LIMIT,
    compute_magnitude,
    extract_insight,
    validate_snapshot,
)
from sonality.priority import ReplyPriority
from sonality.prompts import (
    CORE_IDENTITY,
    REFLECTION_PROMPT,
    build_message_turn,
    build_system_blocks,
    escape_prompt_text,
)
from sonality.store import (
    EPISODIC,
    MAX_LEARNING_ATTEMPTS,
    SEMANTIC,
    AuditEvent,
    Episode,
    InteractionRecord,
    Speaker,
    StateCommit,
    StateStore,
    UsageRecord,
)

log = logging.getLogger(__name__)

ANONYMOUS = Speaker(id="anonymous", name="someone")
REFLECTION_MAX_OUTPUT_TOKENS = 1500
RECENT_EPISODES_FOR_REFLECTION = 30
# Chroma's upsert cost grows quickly past a few dozen items (50 took 60 ms here).
EPISODE_BATCH = 20
#: The background writer waits for this many episodes or this many seconds.
EPISODE_FLUSH_AT = 8
EPISODE_FLUSH_DELAY = 10.0
#: Beliefs (strongest first) shown to the ESS call for judging novelty.
VIEWS_FOR_ESS = 8
#: Learning that waits for the model retries after this long, doubling up to the cap
#: (a provider's own `retry_after`, e.g. a spending limit's midnight, is capped too, so
#: a raised limit or a recovered provider is noticed within minutes).
LEARNING_RETRY_FIRST = 1.0
LEARNING_RETRY_CAP = 300.0


class RollbackError(ValueError):
    """A rollback target that does not exist."""


class ReflectionOutcome(BaseModel):
    """What one reflection did, for commands and the audit log."""

    model_config = ConfigDict(frozen=True)

    ran: bool
    accepted: bool = False
    reason: str = ""
    dropped_beliefs: tuple[str, ...] = ()
    old_chars: int = 0
    new_chars: int = 0
    error: str = ""


class SonalityAgent:
    """The personality of one community (seed: `SonalityAgent`)."""

    def __init__(
        self,
        *,
        client: LLMClient,
        store: StateStore,
        episodes: EpisodeMemory,
        sponge: SpongeState,
        model: str | None = None,
        ess_model: str | None = None,
        label: str = "",
        priority: ReplyPriority | None = None,
        embedder: EmbeddingLane | None = None,
    ) -> None:
        self.client = client
        # Shared by all agents of a runtime, so messages of many communities that wait
        # at once are embedded in one pass; a lone agent gets a lane of its own.
        self._own_embedder = embedder is None
        self.embedder = embedder or EmbeddingLane(episodes.embed_many)
        # Shared by all agents of a runtime so any reply outranks any memory write.
        self.priority = priority or ReplyPriority()
        self.store = store
        self.episodes = episodes
        self.sponge = sponge
        self.model = model or config.MODEL
        self.ess_model = ess_model or config.ESS_MODEL
        self.label = label or "community"
        # Seed attribute: the latest exchange. Per-user history lives in the host's buffers.
        self.conversation: list[dict[str, str]] = []
        self.last_ess: ESSResult | None = None
        self.previous_snapshot: str | None = None
        self._lock = asyncio.Lock()
        self._queue: asyncio.Queue[InteractionRecord] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        # Set while the head of the queue waits for the model; `resume_learning` wakes it.
        self._held = asyncio.Event()
        self._learning: InteractionRecord | None = None
        self._resume = asyncio.Event()
        # ESS results of interactions whose learning waits, so a retry does not pay twice.
        self._classified: dict[str, ESSResult] = {}
        # Members forgotten while running: their queued messages are never learned.
        self._forgotten: set[str] = set()
        self._closed = False
        # Committed episodes not yet in Chroma (write-behind; durable in the store).
        self._unwritten: list[Episode] = []
        self._write_lock = asyncio.Lock()
        self._write_wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def load(
        cls,
        *,
        client: LLMClient,
        store: StateStore,
        episodes: EpisodeMemory,
        model: str | None = None,
        ess_model: str | None = None,
        label: str = "",
        priority: ReplyPriority | None = None,
        embedder: EmbeddingLane | None = None,
    ) -> SonalityAgent:
        """Open a community: its latest version (or the seed as version 0), then replay.

        Interactions answered but not yet post-processed (a crash, a kill -9) are queued
        before anything new, so their effect lands exactly once and in order.
        """
        state = await store.latest_state()
        if state is None:
            state = SpongeState()
            await store.commit(StateCommit(state=state, cause="seed", change="seed personality"))
        agent = cls(
            client=client,
            store=store,
            episodes=episodes,
            sponge=state,
            model=model,
            ess_model=ess_model,
            label=label,
            priority=priority,
            embedder=embedder,
        )
        agent._unwritten = await store.pending_episodes()
        if agent._unwritten:
            agent._write_wake.set()
        pending = await store.pending_interactions()
        if pending:
            log.info("%s: replaying %d unfinished interaction(s)", agent.label, len(pending))
        for record in pending:
            agent._queue.put_nowait(record)
        agent._ensure_worker()
        return agent

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work(), name=f"sonality-post:{self.label}")
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(
                self._write_episodes(), name=f"sonality-episodes:{self.label}"
            )

    async def drain(self) -> None:
        """Wait until every queued interaction is post-processed and its memory written,
        or until learning is held waiting for the model (then what is done is flushed)."""
        join = asyncio.ensure_future(self._queue.join())
        held = asyncio.ensure_future(self._held.wait())
        try:
            await asyncio.wait({join, held}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (join, held):
                waiter.cancel()
        await self.flush_episodes()

    @property
    def learning_held(self) -> bool:
        """True while the oldest unlearned interaction waits for the model."""
        return self._held.is_set()

    def resume_learning(self) -> None:
        """Retry held learning now (a spending limit was raised, a new day began)."""
        self._resume.set()

    @property
    def backlog(self) -> int:
        """Interactions answered but not yet post-processed."""
        return self._queue.qsize() + (1 if self._learning is not None else 0)

    async def close(self, grace_seconds: float = 10.0) -> None:
        """Finish queued post-processing (bounded), then stop the worker.

        Anything not finished stays in the store's outbox and is replayed on next load.
        """
        self._closed = True
        try:
            await asyncio.wait_for(self._queue.join(), grace_seconds)
        except TimeoutError:
            log.warning("%s: %d interaction(s) left for replay", self.label, self._queue.qsize())
        try:
            await asyncio.wait_for(self.flush_episodes(), grace_seconds)
        except Exception:
            log.warning("%s: episodes left for the next start", self.label, exc_info=True)
        for task in (self._worker, self._writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._own_embedder:
            self.embedder.close()

    # ------------------------------------------------------------------ reply path
    async def respond(
        self,
        user_message: str,
        speaker: Speaker | None = None,
        conversation: Sequence[ChatTurn] | Awaitable[Sequence[ChatTurn]] = (),
        on_text: TextSink | None = None,
    ) -> str:
        """Answer one message with a single LLM call; learning happens afterwards.

        `conversation` is the speaker's recent exchanges, or an awaitable of them: the
        host's buffer read then overlaps memory retrieval instead of preceding it.
        `on_text` receives the reply as it streams; the reply is recorded, and learning
        starts, only once the whole of it has arrived.
        Raises `LLMError` when the model cannot answer (a stream broken part-way too);
        nothing is recorded then, so a failed reply leaves the personality untouched.
        """
        if self._closed:
            raise RuntimeError("agent is closed")
        speaker = speaker or ANONYMOUS
        with self.priority.replying():
            retrieval = self._recall(user_message, tuple(self._unwritten))
            history: Sequence[ChatTurn]
            if inspect.isawaitable(conversation):
                memories, history = await asyncio.gather(retrieval, conversation)
            else:
                memories, history = await retrieval, conversation
        # Stable first (rules, then the narrative, which changes only by reflection),
        # then the speaker's earlier turns (cached up to the last one), then this
        # message with its memories and the traits, which move with every commit.
        system = build_system_blocks(self.sponge.snapshot)
        traits = self._build_structured_traits(self.sponge)
        turn = build_message_turn(user_message, speaker.name, memories, traits)
        earlier = [t.model_copy(update={"cache": False}) for t in history]
        if earlier:
            earlier[-1] = earlier[-1].model_copy(update={"cache": True})
        messages = _truncate_conversation([*earlier, ChatTurn(role="user", content=turn)])
        result = await self.client.reply(
            system=system,
            messages=messages,
            max_tokens=config.RESPONSE_MAX_TOKENS,
            model=self.model,
            purpose="reply",
            on_text=on_text,
        )
        reply = result.text.strip()
        if not reply:
            raise LLMError("the model returned an empty answer")
        record = InteractionRecord(
            id=uuid.uuid4().hex,
            speaker=speaker,
            message=user_message,
            reply=reply,
            model=result.model,
            reply_usage=result.usage,
        )
        await self.store.record_interaction(record)
        self.conversation = [
            {"role": "user", "content": user_message},
            {"role": "assistant", "content": reply},
        ]
        self._queue.put_nowait(record)
        self._ensure_worker()
        return reply

    async def _recall(self, text: str, unwritten: Sequence[Episode]) -> list[str]:
        """The memories the message recalls. Its vector is only the query, compared with
        memories embedded from their summaries (the one space of `Episode`), and is not
        kept: the message's episode gets its summary's vector when it is learned.

        Episodes committed but not yet written to Chroma are ranked alongside it, so
        batching the writes never hides a memory.

        Memories enrich a reply but are not worth failing it for: if embedding or the
        vector store errs (seen under load: a just-created index not yet readable), the
        reply goes out without memories and the log says why.
        """
        try:
            embedded = await self.embedder.embed(text)
        except Exception:
            log.exception("%s: could not embed the message; answering without memories", self.label)
            return []
        try:
            memories = await asyncio.to_thread(
                self.episodes.retrieve_typed,
                text,
                config.EPISODIC_RETRIEVAL_COUNT,
                config.SEMANTIC_RETRIEVAL_COUNT,
                config.MIN_EPISODE_RELEVANCE,
                query_embedding=[embedded],
                unwritten=unwritten,
                hidden=self.sponge.hidden_ranges,
            )
        except Exception:
            log.exception("%s: memory retrieval failed; answering without memories", self.label)
            memories = []
        return memories

    # ------------------------------------------------------------------ post-processing
    async def _work(self) -> None:
        while True:
            record = await self._queue.get()
            self._learning = record
            try:
                await self._learn(record)
            finally:
                self._learning = None
                self._classified.pop(record.id, None)
                self._queue.task_done()

    async def _learn(self, record: InteractionRecord) -> None:
        """Post-process one interaction; nothing after it runs until it is done.

        The model being unavailable (an outage, a spending limit) is not the
        interaction's fault: it is retried, in order, until the model answers, so no
        evidence is lost and no later message is learned before it. Any other failure
        counts as an attempt, and the store parks the interaction after a few.
        """
        if record.speaker.id in self._forgotten:
            return
        delay = LEARNING_RETRY_FIRST
        while True:
            usage: list[UsageRecord] = []  # filled by each LLM call of the attempt
            try:
                async with self._lock:
                    await self._post_process(record, usage)
                return
            except asyncio.CancelledError:
                raise
            except LLMError as exc:
                wait = exc.retry_after if exc.retry_after is not None else delay
                wait = min(max(wait, LEARNING_RETRY_FIRST), LEARNING_RETRY_CAP)
                log.warning(
                    "%s: learning of %s waits %.0fs for the model (%s)",
                    self.label,
                    record.id,
                    wait,
                    exc,
                )
                await self._record_spent(usage)
                await self._hold(wait)
            except Exception as exc:
                log.exception("%s: post-processing of %s failed", self.label, record.id)
                try:
                    attempts = await self.store.mark_interaction_failed(record.id, repr(exc), usage)
                except Exception:
                    log.exception("%s: could not record the failure", self.label)
                    return
                if attempts >= MAX_LEARNING_ATTEMPTS:
                    log.error(
                        "%s: gave up on %s after %d attempts", self.label, record.id, attempts
                    )
                    return
                await self._hold(delay)
            delay = min(delay * 2, LEARNING_RETRY_CAP)

    async def _hold(self, seconds: float) -> None:
        self._resume.clear()
        self._held.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resume.wait(), seconds)
        finally:
            self._held.clear()

    async def _record_spent(self, usage: list[UsageRecord]) -> None:
        try:
            await self.store.record_usage(usage)
        except Exception:
            log.exception("%s: could not record the tokens of a held attempt", self.label)

    async def _post_process(self, record: InteractionRecord, usage: list[UsageRecord]) -> None:
        """Seed stages 3-6 for one interaction, committed as one new version.

        `usage` collects the tokens of every LLM call made; the caller records them
        even when the attempt fails.
        """
        state = self.sponge.model_copy(deep=True)
        events: list[AuditEvent] = []

        ess = await self._classify_ess(record, _views(state), usage)
        state.interaction_count += 1
        episodes = [
            Episode(
                id=record.id,  # the interaction id: a replay overwrites, never duplicates
                user_message=record.message,
                agent_response=record.reply,
                ess_score=ess.score,
                topics=ess.topics,
                summary=ess.summary,
                interaction=state.interaction_count,
                version=self.sponge.version + 1,  # the version this commit creates
            )
        ]
        self._update_topics(state, ess)
        disagreed = _disagrees(state, ess)
        committed = self._apply_due(state)
        staged = self._update_opinions(
            state,
            ess,
            interaction_id=record.id,
            member=record.speaker.id,
            version=self.sponge.version + 1,
        )
        state.track_disagreement(disagreed)
        insight = await self._extract_insight(ess, record, usage)
        if insight:
            state.pending_insights.append(insight)
        events.append(
            AuditEvent(
                kind="ess",
                interaction=state.interaction_count,
                payload={
                    "interaction_id": record.id,
                    "speaker": record.speaker.id,
                    "score": ess.score,
                    "reasoning_type": str(ess.reasoning_type),
                    "source_reliability": str(ess.source_reliability),
                    "opinion_direction": str(ess.opinion_direction),
                    "novelty": ess.novelty,
                    "topics": list(ess.topics),
                    "summary": ess.summary,
                    "used_defaults": ess.used_defaults,
                    "staged": staged,
                    "committed": committed,
                    "disagreed": disagreed,
                    "insight": insight,
                },
            )
        )
        outcome = await self._maybe_reflect(state, usage, events, episodes)
        evidence = [
            EvidenceStep(
                kind=MESSAGE,
                interaction=state.interaction_count,
                interaction_id=record.id,
                member=record.speaker.id,
                ess=recorded_ess(ess),
            )
        ]
        if outcome is not None:  # every reflection starts with the decay step
            evidence.append(_decay_step(state))
        episodes = await self._embedded(episodes)
        state.version = self.sponge.version + 1
        change = _describe_interaction(ess, staged, committed, insight, outcome)
        await self.store.commit(
            StateCommit(
                state=state,
                cause="interaction",
                change=change,
                events=events,
                usage=usage,
                episodes=episodes,
                interaction_id=record.id,
                evidence=evidence,
            )
        )
        self._install(state)
        self.last_ess = ess
        self._queue_episodes(episodes)
        if committed:
            log.info(
                "%s: opinion moved (v%d): %s",
                self.label,
                state.version,
                "; ".join(committed),
                extra={"community": self.label},
            )
        if outcome is not None:
            log.info(
                "%s: %s (v%d)",
                self.label,
                _describe_reflection(outcome),
                state.version,
                extra={"community": self.label},
            )

    # ------------------------------------------------------------------ memory writes
    async def _embedded(self, episodes: list[Episode]) -> list[Episode]:
        """The episodes with the vectors of their documents (the ESS summary; an
        insight's text), embedded in one pass of the shared lane once no reply waits.

        Done before the commit so an episode waiting for its batched write is ranked in
        memory, and the vector is kept with it in the store's episode outbox. If
        embedding fails they go without one: the store embeds the same text when it
        writes them, which then happens at once.
        """
        missing = [i for i, e in enumerate(episodes) if e.embedding is None]
        if not missing:
            return episodes
        await self.priority.wait_quiet()
        try:
            vectors = await asyncio.gather(
                *(self.embedder.embed(document_of(episodes[i])) for i in missing)
            )
        except Exception:
            log.warning(
                "%s: could not embed new memories; the store will", self.label, exc_info=True
            )
            return episodes
        ready = list(episodes)
        for i, vector in zip(missing, vectors, strict=True):
            ready[i] = episodes[i].model_copy(update={"embedding": tuple(vector.tolist())})
        return ready

    def _queue_episodes(self, episodes: list[Episode]) -> None:
        if episodes:
            self._unwritten.extend(episodes)
            self._write_wake.set()

    async def _write_episodes(self) -> None:
        """Write episodes in batches: a Chroma upsert holds the GIL of the process that
        runs Chroma (about 13 ms for 8 episodes, mostly waiting on Chroma's own
        threads), and one upsert of eight costs far less than eight of one. So the writer waits for
        EPISODE_FLUSH_AT episodes or EPISODE_FLUSH_DELAY seconds, whichever is first;
        retrieval meanwhile ranks the waiting ones in memory. Every episode is given its
        summary's vector before the commit (`_embedded`); one without (that embedding
        failed) cannot be ranked in memory, so it is written at once."""
        while True:
            await self._write_wake.wait()
            self._write_wake.clear()
            deadline = asyncio.get_running_loop().time() + EPISODE_FLUSH_DELAY
            while (
                len(self._unwritten) < EPISODE_FLUSH_AT
                and all(e.embedding is not None for e in self._unwritten)
                and not self._closed
            ):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._write_wake.wait(), left)
                self._write_wake.clear()
            try:
                await self.flush_episodes()
            except asyncio.CancelledError:
                raise
            except Exception:
                # They stay in the store's episode outbox and are retried on next start.
                log.exception("%s: writing memories failed", self.label)

    async def flush_episodes(self) -> None:
        """Write committed episodes to Chroma in batches, yielding to replies first.

        A Chroma write blocks every query in the process for several milliseconds, so
        the writer waits (bounded) until no reply is retrieving; episodes arriving
        meanwhile join the batch.
        """
        async with self._write_lock:
            while self._unwritten:
                await self.priority.wait_quiet()
                batch = self._unwritten[:EPISODE_BATCH]
                await asyncio.to_thread(self.episodes.store_many, batch)
                await self.store.mark_episodes_written([e.id for e in batch])
                del self._unwritten[: len(batch)]

    def _install(self, state: SpongeState) -> None:
        if state.snapshot != self.sponge.snapshot:
            self.previous_snapshot = self.sponge.snapshot
        self.sponge = state

    async def _classify_ess(
        self, record: InteractionRecord, views: str, usage: list[UsageRecord]
    ) -> ESSResult:
        """ESS of the user's words alone.

        A malformed answer ends in the safe defaults inside `classify`; the model being
        unreachable raises `LLMError`, and the learning waits and retries, because a
        strong argument scored while the provider was down must not count as none.
        """
        known = self._classified.get(record.id)
        if known is not None:
            return known
        ess = await classify(
            self.client, record.message, views, model=self.ess_model, usage_sink=usage
        )
        self._classified[record.id] = ess
        return ess

    async def _extract_insight(
        self, ess: ESSResult, record: InteractionRecord, usage: list[UsageRecord]
    ) -> str | None:
        if ess.score <= config.ESS_THRESHOLD:
            return None
        return await extract_insight(
            self.client,
            ess,
            record.message,
            record.reply,
            model=self.ess_model,
            usage_sink=usage,
        )

    @staticmethod
    def _update_topics(state: SpongeState, ess: ESSResult) -> None:
        for topic in ess.topics:
            state.track_topic(topic)

    @staticmethod
    def _apply_due(state: SpongeState) -> list[str]:
        """Commit staged updates whose cooling period is over; record them as shifts."""
        before = dict(state.opinion_vectors)
        applied = state.apply_due_staged_updates()
        for topic, value in state.opinion_vectors.items():
            moved = abs(value - before.get(topic, 0.0))
            if moved > 0:
                state.record_shift(f"{topic}: {before.get(topic, 0.0):+.3f} -> {value:+.3f}", moved)
        return applied

    @staticmethod
    def _update_opinions(
        state: SpongeState,
        ess: ESSResult,
        *,
        interaction_id: str = "",
        member: str = "",
        version: int = 0,
    ) -> list[dict[str, Any]]:
        """Stage belief moves for strong, directional evidence, with Bayesian resistance.

        effective magnitude = magnitude / (confidence + 1), where arguing against the
        current stance adds |current position| to the confidence. Each update carries
        its source (`interaction_id`, its speaker `member` and `version`, the version
        this commit creates), so the credit for a move stays with the argument that caused it.
        """
        sign = ess.opinion_direction.sign
        if not (ess.score > config.ESS_THRESHOLD and ess.topics and sign != 0):
            return []
        magnitude = compute_magnitude(ess, state)
        staged: list[dict[str, Any]] = []
        for topic in ess.topics:
            old = state.opinion_vectors.get(topic, 0.0)
            meta = state.belief_meta.get(topic)
            confidence = meta.confidence if meta else 0.0
            if old * sign < 0:
                confidence += abs(old)
            effective = magnitude / (confidence + 1.0)
            due = state.stage_opinion_update(
                topic,
                sign,
                effective,
                config.OPINION_COOLING_PERIOD,
                provenance=f"ESS {ess.score:.2f}: {ess.summary[:160]}",
                interaction_id=interaction_id,
                member=member,
                version=version,
            )
            staged.append({"topic": topic, "delta": round(sign * effective, 6), "due": due})
        return staged

    # ------------------------------------------------------------------ reflection
    async def _maybe_reflect(
        self,
        state: SpongeState,
        usage: list[UsageRecord],
        events: list[AuditEvent],
        episodes: list[Episode],
    ) -> ReflectionOutcome | None:
        """Periodic (every REFLECTION_EVERY) or event-driven (cumulative shift) reflection."""
        since = state.interaction_count - state.last_reflection_at
        shift = cumulative_shift(state)
        periodic = since >= config.REFLECTION_EVERY
        event_driven = shift > config.REFLECTION_SHIFT_THRESHOLD
        if not (periodic or event_driven) or since < config.REFLECTION_EVERY // 2:
            return None
        trigger = "periodic" if periodic else f"shift {shift:.3f}"
        return await self._reflect(state, usage, events, trigger, episodes)

    async def _reflect(
        self,
        state: SpongeState,
        usage: list[UsageRecord],
        events: list[AuditEvent],
        trigger: str,
        episodes: list[Episode],
    ) -> ReflectionOutcome:
        """Decay, then consolidate insights into the narrative, validated before use.

        New semantic memories are appended to `episodes`, which the caller commits.
        """
        dropped = tuple(state.decay_beliefs(config.BELIEF_DECAY_RATE))
        await self.flush_episodes()
        recent = await asyncio.to_thread(
            self.episodes.recent_summaries,
            state.last_reflection_at,
            RECENT_EPISODES_FOR_REFLECTION,
            state.hidden_ranges,
        )
        recent = [*recent, *(e.summary for e in episodes if e.memory_type == EPISODIC)][
            -RECENT_EPISODES_FOR_REFLECTION:
        ]
        prompt = REFLECTION_PROMPT.format(
            current_snapshot=escape_prompt_text(state.snapshot),
            structured_traits=escape_prompt_text(self._build_structured_traits(state)),
            current_beliefs=escape_prompt_text(state.belief_summary() or "(none yet)"),
            pending_insights=escape_prompt_text(
                "\n".join(f"- {i}" for i in state.pending_insights) or "(none)"
            ),
            episode_count=len(recent),
            episode_summaries=escape_prompt_text("\n".join(f"- {s}" for s in recent) or "(none)"),
            recent_shifts=escape_prompt_text(
                "\n".join(f"- #{s.interaction}: {s.description}" for s in state.recent_shifts)
                or "(none)"
            ),
            max_tokens=config.SPONGE_MAX_TOKENS,
        )
        old_chars = len(state.snapshot)
        try:
            result = await self.client.reply(
                system=[SystemBlock(text=CORE_IDENTITY, cache=True)],
                messages=[ChatTurn(role="user", content=prompt)],
                max_tokens=REFLECTION_MAX_OUTPUT_TOKENS,
                model=self.ess_model,
                purpose="reflection",
            )
        except LLMError as exc:
            log.warning("%s: reflection failed (%s); state kept", self.label, exc)
            outcome = ReflectionOutcome(
                ran=False, reason=trigger, dropped_beliefs=dropped, error=str(exc)
            )
            events.append(_reflection_event(state, outcome))
            return outcome
        usage.append(UsageRecord(purpose="reflection", model=result.model, usage=result.usage))
        # The prompt showed the narrative escaped; a model that copies its wording may
        # copy an entity too ("R&amp;D"), which would be escaped again next time.
        candidate = _fit_snapshot(html.unescape(result.text).strip())
        accepted = validate_snapshot(state.snapshot, candidate)
        # Insights are consumed by every reflection that ran, accepted or not: left
        # pending, one rejected rewrite would make every later trigger (the idle job
        # among them) pay for the same reflection again. They live on as semantic
        # memories, retrieved before episodes.
        # Named by the reflection's version: two reflections at one interaction count
        # (one of them after a rollback) must not overwrite each other's memories.
        version = self.sponge.version + 1
        episodes.extend(
            Episode(
                id=f"insight-v{version}-{index}",
                user_message=insight,
                ess_score=1.0,
                summary=insight,
                interaction=state.interaction_count,
                memory_type=SEMANTIC,
                version=version,
            )
            for index, insight in enumerate(state.pending_insights)
        )
        state.pending_insights.clear()
        if accepted:
            state.snapshot = candidate
        else:
            log.warning(
                "%s: reflection rejected (%d -> %d chars); snapshot kept",
                self.label,
                old_chars,
                len(candidate),
            )
        state.last_reflection_at = state.interaction_count
        outcome = ReflectionOutcome(
            ran=True,
            accepted=accepted,
            reason=trigger,
            dropped_beliefs=dropped,
            old_chars=old_chars,
            new_chars=len(candidate),
        )
        events.append(_reflection_event(state, outcome))
        return outcome

    async def reflect_now(self, trigger: str, actor: str | None = None) -> ReflectionOutcome:
        """Reflect outside the message flow (scheduler, `/sonality reflect`)."""
        async with self._lock:
            state = self.sponge.model_copy(deep=True)
            usage: list[UsageRecord] = []
            events: list[AuditEvent] = []
            episodes: list[Episode] = []
            outcome = await self._reflect(state, usage, events, trigger, episodes)
            if not outcome.ran and not outcome.dropped_beliefs:
                return outcome
            episodes = await self._embedded(episodes)
            state.version = self.sponge.version + 1
            await self.store.commit(
                StateCommit(
                    state=state,
                    cause="reflection",
                    change=_describe_reflection(outcome),
                    events=events,
                    usage=usage,
                    episodes=episodes,
                    actor=actor,
                    evidence=[_decay_step(state)],
                )
            )
            self._install(state)
            self._queue_episodes(episodes)
            log.info(
                "%s: %s (v%d)",
                self.label,
                _describe_reflection(outcome),
                state.version,
                extra={"community": self.label},
            )
            return outcome

    # ------------------------------------------------------------------ rollback
    async def rollback(self, version: int, actor: str, reason: str = "") -> SpongeState:
        """Restore an earlier version as a new version (so a rollback can be undone).

        The interaction counter stays monotonic; interaction-relative fields of the
        restored state are shifted by the same offset, so decay gaps and cooling periods
        are exactly what they were at that version.
        """
        async with self._lock:
            target = await self.store.state_at(version)
            if target is None or version > self.sponge.version:
                raise RollbackError(f"there is no version {version}")
            restored = _rebase(target, self.sponge.interaction_count)
            restored.version = self.sponge.version + 1
            # Memories formed after the restored version are put out of reach with it
            # (`rollback 0` forgets them all); restoring a later version brings back
            # what it could recall, since each version keeps its own ranges.
            if restored.interaction_count > target.interaction_count:
                restored.hidden_memories.append(
                    HiddenMemories(
                        after=target.interaction_count,
                        upto=restored.interaction_count,
                        from_version=restored.version,
                    )
                )
            await self.store.commit(
                StateCommit(
                    state=restored,
                    cause="rollback",
                    change=f"rollback to v{version}" + (f": {reason}" if reason else ""),
                    events=[
                        AuditEvent(
                            kind="rollback",
                            interaction=restored.interaction_count,
                            payload={"to_version": version, "actor": actor, "reason": reason},
                        )
                    ],
                    actor=actor,
                    evidence=[
                        EvidenceStep(
                            kind=ROLLBACK,
                            interaction=restored.interaction_count,
                            target_version=version,
                        )
                    ],
                )
            )
            self._install(restored)
            return restored

    # ------------------------------------------------------------------ forget-me
    async def forget_episodes(self, member: str, ids: Collection[str]) -> None:
        """Delete a forgotten member's memories (the episodes of their interactions, by
        id) from the episode memory, dropping first those still waiting for the
        write-behind writer so none is written afterwards. Holds the writer's lock, so no
        batch in flight lands after the delete; deleting ids not stored does nothing, so
        a forget-me resumed after a crash can run it again. The episode outbox rows go
        with the member's SQLite rows (`erase_member`)."""
        self._forgotten.add(member)
        drop = set(ids)
        async with self._write_lock:
            self._unwritten = [e for e in self._unwritten if e.id not in drop]
            if drop:
                await asyncio.to_thread(self.episodes.delete, sorted(drop))

    async def forget_member(
        self,
        member: str | None,
        *,
        actor: str,
        drop_insights: Collection[str] = (),
        change: str = "forget-me: opinions replayed without one member",
    ) -> SpongeState:
        """Undo a member's influence: a new version whose opinions are the evidence log
        replayed from the seed without their messages (`sonality.replay`).

        The replayed opinions, their bookkeeping and the updates still cooling replace
        the current ones, rebased to the current interaction count as a rollback is, so
        memory ranges stay valid. The narrative stays until the next reflection; the
        pending insights drawn from the member's messages (`drop_insights`) are dropped
        so that reflection cannot bring their words back. Messages of the member still
        waiting to be learned are skipped from now on.

        `member` None replays the log as it stands: after a rollback to a version from
        before a forget-me, the log (which no longer holds the forgotten member's
        messages) gives the restored opinions without their influence.
        """
        from sonality.replay import replay  # the replay uses this module's steps

        if member is not None:
            self._forgotten.add(member)
        without = () if member is None else (member,)
        async with self._lock:
            steps = await self.store.evidence()
            current = self.sponge
            replayed = _rebase(replay(steps, without_members=without), current.interaction_count)
            state = current.model_copy(deep=True)
            state.opinion_vectors = replayed.opinion_vectors
            state.belief_meta = replayed.belief_meta
            state.staged_opinion_updates = replayed.staged_opinion_updates
            drop = set(drop_insights)
            state.pending_insights = [i for i in state.pending_insights if i not in drop]
            state.version = current.version + 1
            moved = sorted(
                t
                for t in set(current.opinion_vectors) | set(state.opinion_vectors)
                if current.opinion_vectors.get(t) != state.opinion_vectors.get(t)
            )
            change += f"; changed: {', '.join(moved)}" if moved else "; no opinion changed"
            await self.store.commit(
                StateCommit(
                    state=state,
                    cause="forget-me",
                    change=change,
                    events=[
                        AuditEvent(
                            kind="forget-me",
                            interaction=state.interaction_count,
                            payload={"actor": actor, "changed": moved},
                        )
                    ],
                    actor=actor,
                )
            )
            self._install(state)
            return state

    # ------------------------------------------------------------------ traits
    @staticmethod
    def _build_structured_traits(state: SpongeState) -> str:
        """The compact numeric summary of the personality (seed format, plus the moves
        still cooling)."""
        lines = [f"Style: {state.tone}"]
        engagement = state.behavioral_signature.topic_engagement
        if engagement:
            top = sorted(engagement.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
            lines.append("Top topics: " + ", ".join(f"{t}({n})" for t, n in top))
        if state.opinion_vectors:
            ranked = sorted(state.opinion_vectors.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
            parts = []
            for topic, value in ranked[:5]:
                meta = state.belief_meta.get(topic)
                conf = meta.confidence if meta else 0.0
                parts.append(f"{topic}={value:+.2f} c={conf:.1f}")
            lines.append("Strongest opinions: " + ", ".join(parts))
        if state.staged_opinion_updates:
            pending = ", ".join(
                f"{u.topic}({u.signed_magnitude:+.3f})" for u in state.staged_opinion_updates[:5]
            )
            lines.append(f"Still weighing: {pending}")
        lines.append(f"Disagreement rate: {state.behavioral_signature.disagreement_rate:.0%}")
        return "\n".join(lines)


# ---------------------------------------------------------------------- helpers
def _views(state: SpongeState) -> str:
    """What ESS compares a message with to judge its novelty: the committed beliefs.

    The seed sends the whole narrative; the beliefs are what novelty is about, and they
    stay short while a mature narrative runs to 500 tokens on every message's ESS call.
    """
    return state.belief_summary(limit=VIEWS_FOR_ESS) or "No settled views yet."


def _truncate_conversation(turns: list[ChatTurn]) -> list[ChatTurn]:
    """Drop the oldest turns beyond MAX_CONVERSATION_CHARS; never the current message."""
    total = sum(len(t.content) for t in turns)
    start = 0
    while total > config.MAX_CONVERSATION_CHARS and start < len(turns) - 1:
        total -= len(turns[start].content)
        start += 1
    kept = turns[start:]
    # The API wants the conversation to open with a user turn.
    while len(kept) > 1 and kept[0].role != "user":
        kept = kept[1:]
    return kept


def _disagrees(state: SpongeState, ess: ESSResult) -> bool:
    """Structural disagreement: the user argues against a stance the agent holds."""
    sign = ess.opinion_direction.sign
    return sign != 0 and any(state.opinion_vectors.get(t, 0.0) * sign < 0 for t in ess.topics)


def _fit_snapshot(text: str) -> str:
    """Keep a reflection within SNAPSHOT_CHAR_LIMIT, cutting at a sentence end if needed."""
    if len(text) <= SNAPSHOT_CHAR_LIMIT:
        return text
    cut = text[:SNAPSHOT_CHAR_LIMIT]
    end = max(cut.rfind(". "), cut.rfind(".\n"), cut.rfind("! "), cut.rfind("? "))
    return cut[: end + 1] if end > SNAPSHOT_CHAR_LIMIT // 2 else cut


def _rebase(state: SpongeState, interaction_count: int) -> SpongeState:
    restored = state.model_copy(deep=True)
    offset = interaction_count - restored.interaction_count
    restored.interaction_count = interaction_count
    restored.last_reflection_at += offset
    for meta in restored.belief_meta.values():
        meta.last_reinforced += offset
    for update in restored.staged_opinion_updates:
        update.staged_at += offset
        update.due_interaction += offset
    for shift in restored.recent_shifts:
        shift.interaction += offset
    return restored


def recorded_ess(ess: ESSResult) -> RecordedESS:
    """The ESS result as the evidence log keeps it (see `sonality.evidence`)."""
    return RecordedESS(
        score=ess.score,
        reasoning_type=str(ess.reasoning_type),
        source_reliability=str(ess.source_reliability),
        internal_consistency=ess.internal_consistency,
        novelty=ess.novelty,
        topics=tuple(ess.topics),
        summary=ess.summary,
        opinion_direction=str(ess.opinion_direction),
        used_defaults=ess.used_defaults,
    )


def _decay_step(state: SpongeState) -> EvidenceStep:
    """The decay a reflection just applied, at the rate `_reflect` used."""
    return EvidenceStep(
        kind=DECAY, interaction=state.interaction_count, rate=config.BELIEF_DECAY_RATE
    )


def _reflection_event(state: SpongeState, outcome: ReflectionOutcome) -> AuditEvent:
    return AuditEvent(
        kind="reflection",
        interaction=state.interaction_count,
        payload={
            "ran": outcome.ran,
            "accepted": outcome.accepted,
            "trigger": outcome.reason,
            "dropped_beliefs": list(outcome.dropped_beliefs),
            "old_chars": outcome.old_chars,
            "new_chars": outcome.new_chars,
            "error": outcome.error,
            "beliefs": len(state.opinion_vectors),
        },
    )


def _describe_reflection(outcome: ReflectionOutcome) -> str:
    if not outcome.ran:
        base = f"reflection failed ({outcome.error})"
    elif outcome.accepted:
        base = (
            f"reflection ({outcome.reason}): narrative "
            f"{outcome.old_chars}->{outcome.new_chars} chars"
        )
    else:
        base = f"reflection ({outcome.reason}) rejected: {outcome.new_chars} chars too short"
    if outcome.dropped_beliefs:
        base += "; decayed away: " + ", ".join(outcome.dropped_beliefs)
    return base


def _describe_interaction(
    ess: ESSResult,
    staged: list[dict[str, Any]],
    committed: list[str],
    insight: str | None,
    outcome: ReflectionOutcome | None,
) -> str:
    parts = [f"ESS {ess.score:.2f} {ess.reasoning_type}"]
    if staged:
        parts.append("staged " + ", ".join(f"{s['topic']} {s['delta']:+.3f}" for s in staged))
    if committed:
        parts.append("committed " + "; ".join(committed))
    if insight:
        parts.append("insight noted")
    if outcome is not None:
        parts.append(_describe_reflection(outcome))
    return " | ".join(parts)


def cumulative_shift(state: SpongeState) -> float:
    """Shift magnitude since the last reflection (shown by `/sonality status`)."""
    return sum(s.magnitude for s in state.recent_shifts if s.interaction > state.last_reflection_at)
