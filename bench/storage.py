"""Figure 6: bytes on disk per 1,000 messages in one community, SQLite and Chroma.

Workloads (one community, 20 members, replies of about 100 tokens):

* **plain chat**: small talk only (every ESS says "no argument");
* **75 topics argued**: 150 arguments first (each of 75 topics argued twice, with data,
  so each becomes a belief), then the same small talk.

Each starts with 50 chat messages so tables and collections exist; then the measured
phase of chat messages runs, and the figure is what the files grew by over it, per
1,000 messages: the SQLite file plus its WAL after a checkpoint (split by table with
SQLite's `dbstat`), and the Chroma directory. Nothing is pruned: retention counts in
days and this runs in minutes, so the SQLite figure is what the first 90 days of a
community look like, raw text included (`storage.retention` then erases it).

Two ways to drive it:

* **real engine** (1,000 messages): the bot's runtime, each message answered by the
  loopback Anthropic fake and learned (ESS, episode, commit, reflection every 20)
  before the next is sent, with real Chroma and embeddings;
* **fast path** (100,000 messages): the engine's own state arithmetic
  (`sonality.opinions`: `update_topics`, `apply_due`, `update_opinions`; the reflection's
  decay) applied to the state without a model, committed through the real
  `CommunityStore` (record, then commit with the ESS audit event, usage, episode and
  evidence-log steps),
  and the episodes written through the real `CommunityEpisodeStore` with vectors from the real
  embedding model (each distinct document embedded once). Chroma is written in batches
  of 500 (the bot's write-behind memory writes up to 20) to save time; the episode
  outbox is emptied every 8 episodes as that writer does. Run at 1,000 messages too,
  its figures can be held against the real engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.wiring import open_runtime
from bench.cost import CHAT, REPLY
from bot.messages import Community, IncomingMessage, User
from bot.runtime import Runtime
from bot.settings import Settings
from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import default_embedding_function
from providers.anthropic import AnthropicLLM
from sonality import config
from sonality.changes import decay_step, message_step
from sonality.config import EngineConfig
from sonality.ess import ESSResult, OpinionDirection, ReasoningType, SourceReliability
from sonality.llm import Usage
from sonality.opinions import apply_due, disagrees, update_opinions, update_topics
from sonality.state import SpongeState
from sonality.store import (
    SEMANTIC,
    AuditEvent,
    Episode,
    InteractionRecord,
    Speaker,
    StateCommit,
    UsageRecord,
)
from storage import CommunityStore, Database
from storage.maintenance import table_bytes
from tests.fakes.anthropic_server import AnthropicFake

KEY = "sk-bench"
MODEL_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-models"
COMMUNITY = Community(id="discord:802771526474137610", name="bench")
MEMBERS = [User(id=f"{400000000000000000 + i}", name=f"Member {i}") for i in range(20)]
WARMUP = 50
CHROMA_BATCH = 500
OUTBOX_BATCH = 8

_FIELDS = (
    "energy housing transport schooling healthcare privacy farming trade policing "
    "taxation water media science sport museums"
).split()
_ASPECTS = "subsidies regulation pricing access research".split()
TOPICS = [f"{f} {a}" for f in _FIELDS for a in _ASPECTS]  # 75


def argument(topic: str, n: int) -> str:
    return (
        f"A 2024 study on {topic} with {3000 + 17 * n:,} participants found a clear effect, "
        "replicated by two later trials with the same design."
    )


def plan(kind: str, messages: int) -> list[tuple[str, str | None]]:
    """(text, argued topic or None) per message: the setup, then `messages` chat."""
    setup: list[tuple[str, str | None]] = []
    if kind == "topics":
        setup = [(argument(t, n), t) for n in range(2) for t in TOPICS]
    chat = [(CHAT[i % len(CHAT)], None) for i in range(WARMUP + messages)]
    return setup + chat


class Sizes(BaseModel):
    """Bytes on disk at one moment."""

    model_config = ConfigDict(frozen=True)

    sqlite: int
    chroma: int
    tables: dict[str, int]  # SQLite bytes per table, its indexes included


class StorageFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    path: str  # "real engine" | "fast path"
    messages: int
    chroma_written: bool = True
    seconds: float
    start: Sizes
    middle: Sizes
    end: Sizes

    def per_thousand(self, first: Sizes, last: Sizes, messages: int) -> tuple[float, float]:
        """MB per 1,000 messages (SQLite, Chroma) between two measurements."""
        scale = 1000 / messages / 1e6
        return (last.sqlite - first.sqlite) * scale, (last.chroma - first.chroma) * scale

    @property
    def sqlite_mb(self) -> float:
        return self.per_thousand(self.start, self.end, self.messages)[0]

    @property
    def chroma_mb(self) -> float:
        return self.per_thousand(self.start, self.end, self.messages)[1]

    def halves(self) -> tuple[float, float]:
        """SQLite + Chroma MB per 1,000 over the first and the second half."""
        half = self.messages // 2
        first = sum(self.per_thousand(self.start, self.middle, half))
        second = sum(self.per_thousand(self.middle, self.end, self.messages - half))
        return first, second

    def table_mb(self) -> dict[str, float]:
        """SQLite growth per 1,000 messages by group of tables (see `GROUPS`)."""
        scale = 1000 / self.messages / 1e6
        out: dict[str, float] = {}
        counted: set[str] = set()
        for label, tables in GROUPS.items():
            out[label] = scale * sum(
                self.end.tables.get(t, 0) - self.start.tables.get(t, 0) for t in tables
            )
            counted.update(tables)
        others = set(self.end.tables) | set(self.start.tables)
        out["other"] = scale * sum(
            self.end.tables.get(t, 0) - self.start.tables.get(t, 0) for t in others - counted
        )
        return out

    @property
    def kept_mb(self) -> float:
        """SQLite MB per 1,000 messages that no retention removes."""
        tables = self.table_mb()
        return tables["versions"] + tables["other"]


GROUPS = {
    # Kept for good: history is evidence.
    "versions": ("personality_versions",),
    # Text erased after SONALITY_MESSAGE_RETENTION_DAYS, rows gone after the audit's.
    "message text": ("interactions",),
    # Gone after SONALITY_AUDIT_RETENTION_DAYS.
    "audit": ("audit_events", "moderator_actions", "usage_daily"),
    # Bounded per member (50 exchanges) and by SONALITY_BUFFER_TTL_MINUTES.
    "conversation": ("conversation_turns",),
    # Emptied as memories are written.
    "episode outbox": ("episode_outbox",),
}


# --------------------------------------------------------------------------- measuring
def measure(database: Path, chroma: Path) -> Sizes:
    """Checkpoint the WAL (from a second connection, as a backup tool would), then sum
    the database file, its WAL and the Chroma directory."""
    tables = table_bytes(database)
    wal = database.with_name(database.name + "-wal")
    sqlite = database.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    on_disk = sum(f.stat().st_size for f in chroma.rglob("*") if f.is_file())
    return Sizes(sqlite=sqlite, chroma=on_disk, tables=tables)


# --------------------------------------------------------------------------- real engine
def teach(server: AnthropicFake) -> None:
    for n, topic in enumerate(TOPICS):
        server.brain.ess_rule(
            contains=f"study on {topic} ",
            score=0.75,
            direction="supports" if n % 2 else "opposes",
            topics=[topic.replace(" ", "_")],
            novelty=0.7,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
        )
    server.brain.reply_rule(contains="<personality_state>", text=REPLY, in_system=True)


@contextlib.asynccontextmanager
async def _runtime(data_dir: Path, server: AnthropicFake) -> AsyncIterator[Runtime]:
    values: dict[str, Any] = {
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": server.base_url,
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_RATE_LIMIT_MESSAGES": 1_000_000,
        "SONALITY_LLM_MAX_RETRIES": 0,
    }
    settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
    llm = AnthropicLLM(api_key=KEY, base_url=server.base_url, max_retries=0)
    try:
        async with open_runtime(settings, llm=llm) as runtime:
            yield runtime
    finally:
        await llm.aclose()


async def real_engine(work: Path, kind: str, messages: int) -> StorageFigures:
    data = work / f"storage-real-{kind}"
    database, chroma = data / "sonality.sqlite3", data / "chromadb"
    steps = plan(kind, messages)
    setup = len(steps) - messages
    marks: dict[int, Sizes] = {}
    began = time.perf_counter()
    async with AnthropicFake(api_key=KEY) as server:
        teach(server)
        async with _runtime(data, server) as runtime:
            for i, (text, _topic) in enumerate(steps):
                if i in (setup, setup + messages // 2):
                    marks[i] = measure(database, chroma)
                member = MEMBERS[i % len(MEMBERS)]
                await runtime.handle(
                    IncomingMessage(community=COMMUNITY, channel_id="c", user=member, text=text)
                )
                await runtime.drain()
            marks[len(steps)] = measure(database, chroma)
    return StorageFigures(
        kind=kind,
        path="real engine",
        messages=messages,
        seconds=time.perf_counter() - began,
        start=marks[setup],
        middle=marks[setup + messages // 2],
        end=marks[len(steps)],
    )


# --------------------------------------------------------------------------- fast path
class Simulation:
    """One community's learning without a model: what `_post_process` does to the
    state, with the ESS answers the loopback fake gives for this workload."""

    def __init__(
        self,
        store: CommunityStore,
        episodes: CommunityEpisodeStore | None,
        embed: Callable[[str], Any],
        engine: EngineConfig,
    ) -> None:
        self.store = store
        self.engine = engine
        self.episodes = episodes
        self.embed = embed
        self.state = SpongeState()
        self.unwritten: list[Episode] = []
        self.outbox: list[str] = []
        # The Chroma batch being written in a thread while the next messages commit.
        self.writing: asyncio.Task[None] | None = None
        self.count = 0

    @staticmethod
    def ess(text: str, topic: str | None, n: int) -> ESSResult:
        if topic is None:
            return ESSResult(
                score=0.02,
                reasoning_type=ReasoningType.NO_ARGUMENT,
                source_reliability=SourceReliability.NOT_APPLICABLE,
                internal_consistency=True,
                novelty=0.0,
                topics=("small_talk",),
                summary=text[:100],
                opinion_direction=OpinionDirection.NEUTRAL,
            )
        return ESSResult(
            score=0.75,
            reasoning_type=ReasoningType.EMPIRICAL_DATA,
            source_reliability=SourceReliability.PEER_REVIEWED,
            internal_consistency=True,
            novelty=0.7,
            topics=(topic.replace(" ", "_"),),
            summary=text[:100],
            opinion_direction=(
                OpinionDirection.SUPPORTS if TOPICS.index(topic) % 2 else OpinionDirection.OPPOSES
            ),
        )

    async def message(self, text: str, topic: str | None, member: User) -> None:
        self.count += 1
        record = InteractionRecord(
            id=f"{self.count:032x}",
            speaker=Speaker(id=member.id, name=member.name),
            message=text,
            reply=REPLY,
            model=config.DEFAULT_MODEL,
            reply_usage=Usage(input_tokens=2400, output_tokens=100, cache_read_tokens=1800),
        )
        await self.store.record_interaction(record)
        # Changed in place: the agent works on a copy so a failed commit leaves its state
        # alone, and nothing fails here.
        state = self.state
        ess = self.ess(text, topic, self.count)
        usage = [
            UsageRecord(
                purpose="ess",
                model=config.DEFAULT_ESS_MODEL,
                usage=Usage(input_tokens=900, output_tokens=80),
            )
        ]
        state.interaction_count += 1
        episodes = [
            Episode(
                id=record.id,
                user_message=text,
                agent_response=REPLY,
                ess_score=ess.score,
                topics=ess.topics,
                summary=ess.summary,
                interaction=state.interaction_count,
                embedding=self.embed(ess.summary),
            )
        ]
        update_topics(state, ess, config=self.engine)
        disagreed = disagrees(state, ess)
        committed = apply_due(state)
        staged = update_opinions(state, ess, config=self.engine)
        state.track_disagreement(disagreed)
        insight = None
        if ess.score > self.engine.ess_threshold:
            insight = f"People here back claims about {ess.topics[0]} with replicated trials."
            state.pending_insights.append(insight)
            usage.append(
                UsageRecord(
                    purpose="insight",
                    model=config.DEFAULT_ESS_MODEL,
                    usage=Usage(input_tokens=700, output_tokens=40),
                )
            )
        events = [
            AuditEvent(
                kind="ess",
                interaction=state.interaction_count,
                payload={
                    "interaction_id": record.id,
                    "speaker": member.id,
                    "score": ess.score,
                    "reasoning_type": str(ess.reasoning_type),
                    "source_reliability": str(ess.source_reliability),
                    "opinion_direction": str(ess.opinion_direction),
                    "novelty": ess.novelty,
                    "topics": list(ess.topics),
                    "summary": ess.summary,
                    "used_defaults": False,
                    "staged": staged,
                    "committed": committed,
                    "disagreed": disagreed,
                    "insight": insight,
                },
            )
        ]
        evidence = [message_step(state, record, ess)]
        if self.reflect_if_due(state, events, episodes, usage):
            evidence.append(decay_step(state))
        state.version = self.state.version + 1
        await self.store.commit(
            StateCommit(
                state=state,
                cause="interaction",
                change=f"ESS {ess.score:.2f} {ess.reasoning_type}",
                events=events,
                usage=usage,
                episodes=episodes,
                interaction_id=record.id,
                evidence=evidence,
            )
        )
        self.state = state
        await self.write(episodes)

    def reflect_if_due(
        self,
        state: SpongeState,
        events: list[AuditEvent],
        episodes: list[Episode],
        usage: list[UsageRecord],
    ) -> bool:
        """`_maybe_reflect` with the fake's answer: the narrative comes back unchanged;
        True if it ran (and decayed the beliefs)."""
        since = state.interaction_count - state.last_reflection_at
        shift = sum(
            s.magnitude for s in state.recent_shifts if s.interaction > state.last_reflection_at
        )
        every = self.engine.reflection_every
        due = since >= every or shift > config.REFLECTION_SHIFT_THRESHOLD
        if not due or since < every // 2:
            return False
        dropped = state.decay_beliefs(config.BELIEF_DECAY_RATE)
        episodes.extend(
            Episode(
                id=f"insight-{state.interaction_count}-{n}",
                user_message=text,
                ess_score=1.0,
                summary=text,
                interaction=state.interaction_count,
                memory_type=SEMANTIC,
                embedding=self.embed(text),
            )
            for n, text in enumerate(state.pending_insights)
        )
        state.pending_insights.clear()
        state.last_reflection_at = state.interaction_count
        usage.append(
            UsageRecord(
                purpose="reflection",
                model=config.DEFAULT_ESS_MODEL,
                usage=Usage(input_tokens=3000, output_tokens=500),
            )
        )
        events.append(
            AuditEvent(
                kind="reflection",
                interaction=state.interaction_count,
                payload={
                    "ran": True,
                    "accepted": True,
                    "trigger": "periodic",
                    "dropped_beliefs": dropped,
                    "old_chars": len(state.snapshot),
                    "new_chars": len(state.snapshot),
                    "error": "",
                    "beliefs": len(state.opinion_vectors),
                },
            )
        )
        return True

    async def write(self, episodes: Sequence[Episode], force: bool = False) -> None:
        self.unwritten.extend(episodes)
        self.outbox.extend(e.id for e in episodes)
        if len(self.outbox) >= OUTBOX_BATCH or force:
            await self.store.mark_episodes_written(self.outbox)
            self.outbox = []
        if self.episodes is None:
            self.unwritten = []
        elif len(self.unwritten) >= CHROMA_BATCH or force:
            if self.writing is not None:
                await self.writing
            batch, self.unwritten = self.unwritten, []
            self.writing = asyncio.create_task(asyncio.to_thread(self.episodes.store_many, batch))
        if force and self.writing is not None:
            await self.writing
            self.writing = None


async def fast_path(
    work: Path, kind: str, messages: int, write_chroma: bool = True
) -> StorageFigures:
    """The workload through the fast path; without `write_chroma` no episode reaches
    Chroma (its directory stays empty) and only SQLite is measured."""
    data = work / f"storage-fast-{kind}-{messages}"
    database, chroma = data / "sonality.sqlite3", data / "chromadb"
    shutil.rmtree(data, ignore_errors=True)
    chroma.mkdir(parents=True)
    embedder = default_embedding_function(MODEL_CACHE)
    vectors: dict[str, tuple[float, ...]] = {}

    def embed(text: str) -> tuple[float, ...]:
        if text not in vectors:
            vectors[text] = tuple(float(x) for x in embedder([text])[0])
        return vectors[text]

    steps = plan(kind, messages)
    setup = len(steps) - messages
    marks: dict[int, Sizes] = {}
    began = time.perf_counter()
    db = await Database.open(database)
    try:
        store = db.community(COMMUNITY.id)
        await store.commit(
            StateCommit(state=SpongeState(), cause="seed", change="seed personality")
        )
        episodes = (
            CommunityEpisodeStore.for_community(COMMUNITY.id, chroma, embedding_function=embedder)
            if write_chroma
            else None
        )
        # The values the real engine's runtime would follow (SONALITY_* as read here).
        sim = Simulation(store, episodes, embed, EngineConfig.from_environment())
        for i, (text, topic) in enumerate(steps):
            if i in (setup, setup + messages // 2):
                await sim.write([], force=True)
                marks[i] = measure(database, chroma)
            await sim.message(text, topic, MEMBERS[i % len(MEMBERS)])
        await sim.write([], force=True)
        marks[len(steps)] = measure(database, chroma)
    finally:
        await db.close()
    return StorageFigures(
        kind=kind,
        path="fast path",
        messages=messages,
        chroma_written=write_chroma,
        seconds=time.perf_counter() - began,
        start=marks[setup],
        middle=marks[setup + messages // 2],
        end=marks[len(steps)],
    )


# --------------------------------------------------------------------------- the figure
Report = Callable[..., None]

LABELS = {"chat": "plain chat", "topics": "after 75 topics were argued"}


def totals(f: StorageFigures, plain: StorageFigures) -> tuple[float, float]:
    """SQLite + Chroma MB per 1,000 of `f` and of plain chat; a run that wrote no
    Chroma counts plain chat's (one episode per message, whatever the topics)."""
    chroma = f.chroma_mb if f.chroma_written else plain.chroma_mb
    return f.sqlite_mb + chroma, plain.sqlite_mb + plain.chroma_mb


def describe(f: StorageFigures, plain: StorageFigures) -> str:
    tables = ", ".join(f"{k} {v:.3f}" for k, v in f.table_mb().items() if round(v, 3))
    text = (
        f"SQLite {f.kept_mb:.3f} MB kept for good per 1,000 messages "
        f"({f.sqlite_mb:.3f} MB with every row still kept: {tables}); "
        + (f"Chroma {f.chroma_mb:.2f} MB" if f.chroma_written else "Chroma not written")
    )
    if f is not plain:
        total, plain_total = totals(f, plain)
        text += (
            f"; {total / plain_total:.2f}× plain chat's bytes "
            f"({f.kept_mb / plain.kept_mb:.2f}× its SQLite kept for good)"
        )
    if f.messages >= 10_000:
        first, second = f.halves()
        what = "SQLite + Chroma" if f.chroma_written else "SQLite"
        text += f"; {what} over the first / second half {first:.2f} / {second:.2f} MB per 1,000"
    return text + f"; {f.seconds:.0f} s"


def verdict(f: StorageFigures, plain: StorageFigures) -> bool:
    """Kept for good < 1 MB per 1,000; after many topics within 10% of plain chat; at
    10,000 messages or more, the second half grows within 10% of the first (at 1,000,
    Chroma's index grows in steps too coarse to tell)."""
    total, plain_total = totals(f, plain)
    ok = f.kept_mb < 1.0 and total <= 1.1 * plain_total
    if f.messages >= 10_000:
        first, second = f.halves()
        ok = ok and abs(second - first) <= 0.1 * max(first, second)
    return ok


def fast_in_parallel(work: Path, messages: int) -> list[StorageFigures]:
    """Both fast-path workloads at once, one process each (one per core). Only plain
    chat writes Chroma: what Chroma keeps per message (one episode) does not depend on
    the topics, and writing it twice would double the time."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.storage", kind, str(messages), str(work), chroma],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        )
        for kind, chroma in (("chat", "chroma"), ("topics", "no-chroma"))
    ]
    figures = []  # plain chat, then topics
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"the fast path failed (exit {proc.returncode})")
        figures.append(StorageFigures.model_validate_json(out.strip().splitlines()[-1]))
    return figures


async def figure_storage(
    work: Path, report: Report, real: int = 1_000, fast: int = 100_000
) -> None:
    """Figure 6: the real engine at `real` messages, the fast path at `real` (to hold
    against it) and at `fast`, each with plain chat and after 75 topics; one line per
    run as it ends."""
    for path in ("real engine", "fast path"):
        runner = real_engine if path == "real engine" else fast_path
        plain = await runner(work, "chat", real)
        line(report, plain, plain)
        line(report, await runner(work, "topics", real), plain)
    if fast != real:
        plain, topics = await asyncio.to_thread(fast_in_parallel, work, fast)
        line(report, plain, plain)
        line(report, topics, plain)


def line(report: Report, f: StorageFigures, plain: StorageFigures) -> None:
    how = (
        "the real engine (runtime, loopback Anthropic fake, real Chroma and embeddings)"
        if f.path == "real engine"
        else "the fast path (the engine's state arithmetic without a model, the real "
        "CommunityStore"
        + (
            " and CommunityEpisodeStore, Chroma written in batches of 500)"
            if f.chroma_written
            else "; no Chroma: its episodes are plain chat's)"
        )
    )
    setup = "150 arguments on 75 topics, then " if f.kind == "topics" else ""
    report(
        f"6. disk per 1,000 messages, {LABELS[f.kind]}, {f.path}, {f.messages:,} messages",
        describe(f, plain),
        f"one community, 20 members, replies of about 100 tokens: {setup}{WARMUP} chat "
        f"messages, then {f.messages:,} measured, through {how}; SQLite file + WAL after a "
        "checkpoint (split by table), Chroma directory; nothing pruned yet (retention "
        "counts in days)",
        "SQLite kept for good < 1 MB per 1,000 chat messages; bytes within 10% of plain "
        "chat after many topics; linear (halves within 10%) from 10,000 messages",
        verdict(f, plain),
    )


if __name__ == "__main__":
    # One fast-path run for `fast_in_parallel`: KIND MESSAGES WORKDIR chroma|no-chroma;
    # prints the figures as JSON.
    kind, count, where, chroma = sys.argv[1:5]
    result = asyncio.run(fast_path(Path(where), kind, int(count), chroma == "chroma"))
    print(result.model_dump_json(), flush=True)
