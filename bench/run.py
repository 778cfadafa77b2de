"""The reply-path figures (1, 2, 3, 4, 5 and 8) and what they share: the bot against a
loopback LLM of fixed latency. The list of every figure, and the command that runs
them, is bench/catalog.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chromadb.api.types import Documents, EmbeddingFunction

from app.wiring import open_runtime
from bench.cost import describe, measure_cost
from bot.messages import Community, IncomingMessage, User
from bot.runtime import Runtime
from bot.settings import Settings
from chroma_memory.community_store import CommunityEpisodeStore, collection_name_for
from chroma_memory.embedding import (
    close_chroma_client,
    default_embedding_function,
    make_chroma_client,
)
from chroma_memory.server import ServerChroma
from chroma_memory.shared_chroma import SharedChroma
from providers import DEFAULT_MODELS
from providers.anthropic import AnthropicLLM
from providers.forwarding import ForwardingLLM
from sonality.llm import ChatTurn, LLMClient, R
from sonality.memory.episodes import Episode
from sonality.prompts import build_message_turn, build_system_blocks
from sonality.state import SEED_SNAPSHOT, SpongeState
from sonality.store import StateCommit

if TYPE_CHECKING:
    from providers.openai import OpenAILLM

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
MODEL_CACHE = CACHE / "test-models"
KEY = "sk-bench"

TOPICS = [
    ("nuclear power", "is safer per TWh than most people assume"),
    ("remote work", "raises output for focused engineering work"),
    ("sourdough baking", "needs a longer cold proof for flavour"),
    ("football tactics", "rewards a high press against slow build-up"),
    ("tax policy", "should shift from labour towards land"),
    ("public transport", "pays off when frequency beats coverage"),
    ("open source", "survives on a few unpaid maintainers"),
    ("chess openings", "matter less than endgame technique for amateurs"),
    ("urban cycling", "gets safer with protected lanes"),
    ("sleep", "is the cheapest performance enhancer"),
    ("language learning", "works best with spaced repetition"),
    ("climate policy", "needs carbon prices that rise predictably"),
]
SOURCES = [
    "a meta-analysis",
    "a field trial",
    "a personal anecdote",
    "a news article",
    "census data",
]


def episode_texts(n: int, seed: int = 7) -> Iterator[Episode]:
    rng = random.Random(seed)
    for i in range(n):
        topic, claim = TOPICS[i % len(TOPICS)]
        source = rng.choice(SOURCES)
        summary = f"User argued that {topic} {claim}, citing {source} (#{i})."
        yield Episode(
            id=f"seed-{i}",
            user_message=summary,
            agent_response="noted",
            ess_score=round(rng.random() * 0.8, 2),
            topics=(topic.replace(" ", "_"),),
            summary=summary,
            interaction=i,
        )


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def report(name: str, value: str, workload: str, target: str, ok: bool | None = None) -> None:
    verdict = "" if ok is None else ("  [meets target]" if ok else "  [MISSES target]")
    print(f"{name}: {value}  ({workload}; target {target}){verdict}", flush=True)


# --------------------------------------------------------------------------- plumbing
@contextlib.contextmanager
def llm_server(
    latency: float, vendor: str = "anthropic", first_token: float = 0.0, rate: float = 0.0
) -> Iterator[str]:
    """The loopback LLM in its own process; `first_token` and `rate` pace its streams."""
    command = [sys.executable, "-m", "bench.llm_server", "--latency", str(latency)]
    command += ["--vendor", vendor, "--first-token", str(first_token)]
    command += ["--tokens-per-second", str(rate)]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def settings_for(data_dir: Path, base_url: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": base_url,
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_RATE_LIMIT_MESSAGES": 1_000_000,
        "SONALITY_LLM_MAX_RETRIES": 0,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def make_llm(base_url: str, cap: int, vendor: str = "anthropic") -> AnthropicLLM | OpenAILLM:
    options: dict[str, Any] = {
        "api_key": KEY,
        "base_url": base_url,
        "max_retries": 0,
        "timeout": 60.0,
        "max_concurrency": cap,
    }
    if vendor == "openai":
        from providers.openai import OpenAILLM  # only when used: the SDK is 13 MB

        return OpenAILLM(default_model=DEFAULT_MODELS["openai"][0], **options)
    return AnthropicLLM(**options)


_reply_seconds: ContextVar[list[float] | None] = ContextVar("_reply_seconds", default=None)


class TimedLLM(ForwardingLLM):
    """Counts calls and times each reply call, attributing it to the calling task."""

    def __init__(self, inner: LLMClient) -> None:
        super().__init__(inner)
        self.calls = 0

    async def _forward(
        self, purpose: str, model: str | None, call: Callable[[], Awaitable[R]]
    ) -> R:
        start = time.perf_counter()
        try:
            return await call()
        finally:
            self.calls += 1
            sink = _reply_seconds.get()
            if sink is not None and purpose == "reply":
                sink.append(time.perf_counter() - start)


def cached_chroma(community_id: str, episodes: int) -> Path:
    """An embedded Chroma directory holding `episodes` episodes for the community,
    built once and kept across runs."""
    cached = CACHE / "bench" / f"chroma-{episodes}"
    if not (cached / "done").exists():
        shutil.rmtree(cached, ignore_errors=True)
        cached.mkdir(parents=True)
        store = CommunityEpisodeStore.for_community(
            community_id, cached, embedding_function=default_embedding_function(MODEL_CACHE)
        )
        batch: list[Episode] = []
        for episode in episode_texts(episodes):
            batch.append(episode)
            if len(batch) == 500:
                store.store_many(batch)
                batch = []
        store.store_many(batch)
        (cached / "done").write_text(str(store.count()))
        close_chroma_client(cached)
    return cached


def seeded_chroma(data_dir: Path, community_id: str, episodes: int) -> float:
    """Put `episodes` episodes in the community's collection (cached across runs)."""
    start = time.perf_counter()
    shutil.copytree(cached_chroma(community_id, episodes), data_dir / "chromadb")
    return time.perf_counter() - start


def seeded_server(url: str, community_id: str, episodes: int) -> tuple[str, float]:
    """The same episodes, vectors included, copied into a fresh database on the Chroma
    server at `url`: its name and the seconds the copy took."""
    start = time.perf_counter()
    cached = cached_chroma(community_id, episodes)
    name = collection_name_for(community_id)
    source = make_chroma_client(cached).get_collection(name)
    database = f"bench{uuid.uuid4().hex}"
    server = ServerChroma(url, database=database)
    store = CommunityEpisodeStore.for_community(
        community_id,
        None,
        client=server,
        embedding_function=default_embedding_function(MODEL_CACHE),
    )
    target = server.client.get_collection(store.collection_name)
    for offset in range(0, source.count(), 1000):
        got = source.get(
            limit=1000, offset=offset, include=["embeddings", "documents", "metadatas"]
        )
        target.upsert(
            ids=got["ids"],
            embeddings=got["embeddings"],
            documents=got["documents"],
            metadatas=got["metadatas"],
        )
    server.close()
    close_chroma_client(cached)
    return database, time.perf_counter() - start


@contextlib.asynccontextmanager
async def bot(
    data_dir: Path, base_url: str, cap: int, vendor: str = "anthropic", **extra: Any
) -> AsyncIterator[tuple[Runtime, TimedLLM]]:
    inner = make_llm(base_url, cap, vendor)
    llm = TimedLLM(inner)
    if vendor == "openai":
        extra["SONALITY_LLM_PROVIDER"] = "openai"
    settings = settings_for(data_dir, base_url, SONALITY_MAX_CONCURRENT_LLM=cap, **extra)
    try:
        async with open_runtime(settings, llm=llm) as runtime:
            yield runtime, llm
    finally:
        await inner.aclose()


async def seed_state(runtime: Runtime, community: Community, interactions: int) -> None:
    """A community with N stored episodes has had N interactions: say so in its state."""
    state = SpongeState(interaction_count=interactions, last_reflection_at=interactions)
    await runtime.db.community(community.id).commit(
        StateCommit(state=state, cause="seed", change="benchmark seed")
    )
    await runtime.registry.agent_for(community)


def chroma_reopens(runtime: Runtime) -> int:
    """How often the shared Chroma client was reopened to free memory indexes."""
    return runtime.memory.reopens() if runtime.memory is not None else 0


def message(community: Community, i: int, users: int = 20) -> IncomingMessage:
    topic, _ = TOPICS[i % len(TOPICS)]
    return IncomingMessage(
        community=community,
        channel_id="bench",
        user=User(id=f"user-{i % users}", name=f"User {i % users}"),
        text=f"What do you make of {topic}? Question {i}.",
    )


# --------------------------------------------------------------------------- figures
async def figure_reply_ratio(
    work: Path,
    episodes: int,
    latency: float,
    n: int,
    vendor: str = "anthropic",
    chroma_url: str | None = None,
    database_url: str | None = None,
) -> None:
    community = Community(id="bench:big", name="big")
    data = work / (f"ratio-{vendor}" + ("-pg" if database_url else ""))
    where: dict[str, Any] = {}
    if chroma_url is None:
        seed_s = seeded_chroma(data, community.id, episodes)
    else:
        database, seed_s = seeded_server(chroma_url, community.id, episodes)
        where = {"CHROMA_URL": chroma_url, "SONALITY_CHROMA_DATABASE": database}
    if database_url is not None:
        where["DATABASE_URL"] = database_url
    with llm_server(latency, vendor) as url:
        async with bot(data, url, cap=16, vendor=vendor, **where) as (runtime, llm):
            await seed_state(runtime, community, episodes)
            system = build_system_blocks(SEED_SNAPSHOT)
            bare = []
            for i in range(10):
                start = time.perf_counter()
                await llm.reply(
                    system=system,
                    messages=[
                        ChatTurn(
                            role="user",
                            content=build_message_turn(f"ping {i}", "User", ["a memory " * 20] * 5),
                        )
                    ],
                    max_tokens=256,
                )
                bare.append(time.perf_counter() - start)
            replies = []
            for i in range(n):
                start = time.perf_counter()
                await runtime.handle(message(community, i))
                replies.append(time.perf_counter() - start)
            await runtime.drain()
            count = runtime.registry.get(community.id).episodes.count()  # type: ignore[union-attr]
    ratio = statistics.median(replies) / statistics.median(bare)
    labels = ([] if vendor == "anthropic" else [vendor]) + (["PostgreSQL"] if database_url else [])
    labels += ["Chroma server"] if chroma_url else []
    report(
        ("1s" if database_url else "1")
        + ". reply time / bare LLM round trip"
        + (f" ({', '.join(labels)})" if labels else ""),
        f"{ratio:.3f} (reply p50 {fmt_ms(statistics.median(replies))}, "
        f"bare p50 {fmt_ms(statistics.median(bare))})",
        f"{n} sequential replies vs 10 bare calls, LLM latency {latency * 1000:.0f} ms, "
        f"{count:,} episodes in the community (seeded in {seed_s:.1f} s)",
        "≤ 1.05",
        ratio <= 1.05,
    )


async def figure_own_time(work: Path, episodes: int, n: int) -> None:
    """Two workloads: each message after the previous one's learning finished (a chat
    at human pace), and back-to-back (learning of message i overlaps the reply to i+1)."""
    community = Community(id="bench:big", name="big")
    data = work / "own"
    seeded_chroma(data, community.id, episodes)
    results: dict[str, tuple[list[float], list[float]]] = {}
    with llm_server(0.0) as url:
        async with bot(data, url, cap=16) as (runtime, _llm):
            await seed_state(runtime, community, episodes)
            for i in range(5):  # warm-up
                await runtime.handle(message(community, 10_000 + i))
            await runtime.drain()
            for mode in ("paced", "back-to-back"):
                times: list[float] = []
                llm_times: list[float] = []
                for i in range(n):
                    sink: list[float] = []
                    token = _reply_seconds.set(sink)
                    start = time.perf_counter()
                    await runtime.handle(message(community, i))
                    times.append(time.perf_counter() - start)
                    _reply_seconds.reset(token)
                    llm_times.extend(sink)
                    if mode == "paced":
                        await runtime.drain()
                await runtime.drain()
                results[mode] = (times, llm_times)
    for mode, (times, llm_times) in results.items():
        p50, p99 = percentile(times, 50), percentile(times, 99)
        paced = mode == "paced"
        report(
            f"2{'' if paced else 'b'}. own time per message, {mode}",
            f"p50 {fmt_ms(p50)}, p99 {fmt_ms(p99)} (of which the loopback LLM call "
            f"p50 {fmt_ms(statistics.median(llm_times))})",
            f"{n} messages from 20 users, LLM answering at once, {episodes:,} episodes, "
            + (
                "each sent once the previous one's learning had finished"
                if paced
                else "sent back to back while learning runs in the background"
            ),
            "p50 ≤ 25 ms, p99 ≤ 100 ms" if paced else "none (shows contention on 2 cores)",
            (p50 <= 0.025 and p99 <= 0.100) if paced else None,
        )


async def figure_stream_ratio(work: Path, n: int, first_token: float, rate: float) -> None:
    """Time to the first text an adapter can show ÷ the model's time to first token, with
    the loopback LLM streaming at a fixed rate; the whole reply's time beside it."""
    community = Community(id="bench:stream", name="stream")
    firsts: list[float] = []
    wholes: list[float] = []
    with llm_server(0.0, first_token=first_token, rate=rate) as url:
        async with bot(work / "stream", url, cap=8) as (runtime, _llm):
            for i in range(n + 3):  # the first 3 warm up (model load, first connection)
                seen: list[float] = []

                async def sink(piece: str, seen: list[float] = seen) -> None:
                    if not seen:
                        seen.append(time.perf_counter())

                start = time.perf_counter()
                reply = await runtime.handle(message(community, i), on_text=sink)
                end = time.perf_counter()
                assert reply is not None and reply.streamed and seen, reply
                await runtime.drain()
                if i >= 3:
                    firsts.append(seen[0] - start)
                    wholes.append(end - start)
    ratio = statistics.median(firsts) / first_token
    report(
        "8. time to first visible text ÷ the model's time to first token",
        f"{ratio:.3f} (first text p50 {fmt_ms(statistics.median(firsts))}, "
        f"whole reply p50 {fmt_ms(statistics.median(wholes))})",
        f"{n} messages, one at a time, loopback Anthropic streaming with {first_token:g} s "
        f"to first token then {rate:g} tokens/s, text taken at the runtime's stream sink",
        "≤ 1.1",
        ratio <= 1.1,
    )


@dataclass
class Window:
    """What one stretch of figure 3's workload cost: the bot process's CPU seconds
    (every thread: the event loop, the embedding lane, Chroma's and SQLite's threads)
    from its first message until its last one was learned and its memories written."""

    replies: int = 0
    seconds: float = 0.0  # wall time from the first message to the last learned
    cpu: float = 0.0
    overheads: list[float] = field(default_factory=list)  # reply time outside the model
    threads: dict[str, float] = field(default_factory=dict)  # CPU seconds by kind of thread

    @property
    def cpu_per_reply(self) -> float:
        return self.cpu / max(1, self.replies)

    def by_thread(self) -> str:
        """Where the CPU of one message went, by kind of thread (0.5 ms or more)."""
        each = {kind: cpu / max(1, self.replies) for kind, cpu in self.threads.items()}
        return ", ".join(f"{kind} {fmt_ms(cpu)}" for kind, cpu in each.items() if cpu >= 0.0005)


async def answer(
    runtime: Runtime, community: Community, i: int, window: Window, sent: float | None = None
) -> None:
    """One message through the whole runtime; its reply time outside the model call is
    counted from `sent` (the moment it was due) when given, else from now."""
    sink: list[float] = []
    _reply_seconds.set(sink)  # this task's own context: only its reply call lands here
    start = time.perf_counter() if sent is None else sent
    await runtime.handle(message(community, i, users=3))
    if sink:
        window.overheads.append(time.perf_counter() - start - sink[0])
        window.replies += 1


async def learned(runtime: Runtime) -> None:
    """Until every message so far is learned and its memories written to Chroma, so the
    window's CPU holds the whole of each message's work."""
    await runtime.drain()
    for agent in runtime.registry.loaded().values():
        await agent.flush_episodes()


async def chat_for(
    runtime: Runtime, groups: Sequence[Community], seconds: float, first: int = 0
) -> Window:
    """Closed loop, figure 3a's workload (and 3s's, in each process): every community
    sends its next message as soon as its previous reply is back, for `seconds`; then
    learning finishes. Message numbers start at `first`."""
    window = Window()
    deadline = time.perf_counter() + seconds

    async def chat(community: Community) -> None:
        i = first
        while time.perf_counter() < deadline:
            await answer(runtime, community, i, window)
            i += 1

    threads, cpu, start = thread_cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(chat(c) for c in groups))
    await learned(runtime)
    window.cpu, window.seconds = time.process_time() - cpu, time.perf_counter() - start
    window.threads = cpu_since(threads, window.cpu)
    return window


async def offer(
    runtime: Runtime, groups: Sequence[Community], rate: float, seconds: float, first: int = 0
) -> Window:
    """Open loop, figure 3b's workload: messages arrive at `rate` per second on average
    (exponential gaps, a fixed seed), whether or not earlier ones were answered, to the
    communities in turn. Each reply's time outside the model counts from the moment its
    message was due, so a busy event loop that starts it late is charged to the reply."""
    window = Window()
    gaps = random.Random(3)
    tasks: list[asyncio.Task[None]] = []
    threads, cpu, start = thread_cpu(), time.process_time(), time.perf_counter()
    due = 0.0
    while (due := due + gaps.expovariate(rate)) < seconds:
        await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
        n = len(tasks)
        community = groups[n % len(groups)]
        tasks.append(
            asyncio.create_task(answer(runtime, community, first + n, window, start + due))
        )
    await asyncio.gather(*tasks)
    await learned(runtime)
    window.cpu, window.seconds = time.process_time() - cpu, time.perf_counter() - start
    window.threads = cpu_since(threads, window.cpu)
    return window


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Each live thread of this process (Linux /proc): its kind and CPU seconds so far.
    What a message's CPU went to; `Window.cpu` is the whole, threads that ended too."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    threads: dict[int, tuple[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            head, _, rest = (task / "stat").read_text().rpartition(")")
            fields = rest.split()
            tid = int(task.name)
            name = names.get(tid) or head.partition("(")[2]
            threads[tid] = (thread_kind(name), (int(fields[11]) + int(fields[12])) / tick)
    return threads


def cpu_since(before: dict[int, tuple[str, float]], cpu: float) -> dict[str, float]:
    """CPU seconds by kind of thread since `before`, largest first. What threads that
    ended meanwhile spent (Chroma's own, which die with each reopen of its client) is
    the rest of `cpu`, the process's whole."""
    spent: dict[str, float] = {}
    for tid, (kind, now) in thread_cpu().items():
        spent[kind] = spent.get(kind, 0.0) + now - before.get(tid, (kind, 0.0))[1]
    spent["threads that ended"] = cpu - sum(spent.values())
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def thread_kind(name: str) -> str:
    if name == "MainThread":
        return "event loop"
    if name.startswith("embedding-lane"):
        return "embedding"
    if name.startswith("asyncio_"):
        return "Chroma calls"
    if "_connection_worker_thread" in name:
        return "SQLite"
    return name


#: Figure 3a's goal (issue 23): half the CPU one message cost before the int8 model,
#: 25 ms (median of 8 runs, 21–29 ms, 2026-11-27; docs/performance.md).
CPU_PER_MESSAGE_TARGET = 0.0125


def cores() -> int:
    """The cores this process may run on (what a capacity is divided over)."""
    return len(os.sched_getaffinity(0))


def embedded_episodes(n: int, embed: EmbeddingFunction[Documents]) -> list[Episode]:
    """`n` episodes with their vectors, computed once for every community that stores
    them: a figure about what stored memories cost, not about embedding them."""
    import numpy as np

    episodes = list(episode_texts(n))
    vectors = embed([e.summary for e in episodes])
    return [
        e.model_copy(update={"embedding": np.asarray(v, dtype=float).tolist()})
        for e, v in zip(episodes, vectors, strict=True)
    ]


#: Figure 3k: a quiet community's memories, fewer than Chroma's 32 writes between two
#: saves of an index (chroma_memory.community_store.SYNC_THRESHOLD), so all of them wait
#: in Chroma's write log, as a community's last writes do in a long-running bot.
QUIET_MEMORIES = 15


def seed_memories(chroma_dir: Path, community_ids: Sequence[str], per_community: int) -> None:
    """`per_community` memories in each community's collection, as after that many
    messages (figure 3h: what is measured is opening and querying indexes of that size)."""
    embed = default_embedding_function(MODEL_CACHE)
    episodes = embedded_episodes(per_community, embed)
    chroma = SharedChroma(chroma_dir, max_open=32)
    for cid in community_ids:
        CommunityEpisodeStore.for_community(
            cid, None, client=chroma, embedding_function=embed
        ).store_many(episodes)
    close_chroma_client(chroma_dir)


async def figure_capacity(
    work: Path,
    communities: int,
    latency: float,
    cap: int,
    seconds: float,
    max_open: int | None = None,
    history: int = 0,
    quiet: int = 0,
) -> None:
    """Figure 3: what one message costs the bot in CPU, and how fast it answers when
    the machine is half busy. See docs/performance.md ("Figure 3: capacity") for why
    capacity is measured this way rather than as throughput at saturation.

    3a: every community chats back to back (a closed loop, as busy as 100 communities
    get), and the bot process's CPU time over that window, learning and memory writes
    included, is divided by the messages answered. Capacity is then cores ÷ that: the
    messages per second the machine's cores could serve if they did nothing else.
    3b: messages arrive at half that capacity (an open loop, as members send them), and
    the reply time outside the model is measured from each message's arrival.
    With `max_open`, Chroma may keep that many collections open (figure 3m); with
    `history`, each community starts with that many memories (figure 3h); with `quiet`,
    that many more communities are known, each with `QUIET_MEMORIES` memories that
    Chroma has not yet saved in an index, and send nothing (figure 3k)."""
    data = work / f"capacity-{max_open}-{history}-{quiet}"
    groups = [Community(id=f"bench:c{i}", name=f"c{i}") for i in range(communities)]
    if history:
        await asyncio.to_thread(seed_memories, data / "chromadb", [c.id for c in groups], history)
    if quiet:
        known = [f"bench:q{i}" for i in range(quiet)]
        await asyncio.to_thread(seed_memories, data / "chromadb", known, QUIET_MEMORIES)
    load = os.getloadavg()[0]  # the machine is shared: say how busy it was
    extra: dict[str, Any] = {} if max_open is None else {"SONALITY_CHROMA_MAX_OPEN": max_open}
    with llm_server(latency) as url:
        async with bot(data, url, cap=cap, **extra) as (runtime, _llm):
            await asyncio.gather(*(runtime.registry.agent_for(c) for c in groups))
            # Warm-up: model loaded, every collection made, one episode each.
            await asyncio.gather(*(answer(runtime, c, 0, Window()) for c in groups))
            await learned(runtime)
            busy = await chat_for(runtime, groups, seconds, first=1)
            capacity = cores() / busy.cpu_per_reply
            half = await offer(runtime, groups, capacity / 2, seconds, first=10_000)
            reopens = chroma_reopens(runtime)
    setting = "" if max_open is None else f", SONALITY_CHROMA_MAX_OPEN={max_open}"
    if history:
        setting += f", {history} memories each to start with"
    if quiet:
        setting += f", {quiet:,} more communities known ({QUIET_MEMORIES} unsaved memories each)"
    report(
        f"3a. bot CPU per answered message, {communities} active communities{setting}",
        f"{fmt_ms(busy.cpu_per_reply)} ({busy.cpu:.1f} s CPU over {busy.replies} replies "
        f"in {busy.seconds:.1f} s, {busy.cpu / busy.seconds:.2f} cores busy); capacity "
        f"{cores()} cores ÷ that = {capacity:.0f} messages/s; of which {busy.by_thread()}",
        f"each of {communities} communities sends its next message when its reply is back, "
        f"for {seconds:.0f} s, until learned and written; LLM latency "
        f"{latency * 1000:.0f} ms, cap {cap}; process CPU time (all threads), loopback LLM "
        f"in its own process; load average {load:.1f} before",
        f"≤ {fmt_ms(CPU_PER_MESSAGE_TARGET)}, half the 25 ms of 2026-11-27",
        busy.cpu_per_reply <= CPU_PER_MESSAGE_TARGET,
    )
    report(
        f"3b. reply time outside the model at half capacity{setting}",
        f"p50 {fmt_ms(percentile(half.overheads, 50))}, "
        f"p99 {fmt_ms(percentile(half.overheads, 99))} ({half.replies} replies; CPU per "
        f"message here {fmt_ms(half.cpu_per_reply)}, {half.cpu / half.seconds:.2f} cores "
        f"busy, of which {half.by_thread()}; Chroma reopened {reopens} times in all)",
        f"{capacity / 2:.0f} messages/s offered (exponential gaps) for {seconds:.0f} s, "
        f"to {communities} communities in turn; counted from each message's arrival; "
        f"LLM latency {latency * 1000:.0f} ms, cap {cap}; load average "
        f"{os.getloadavg()[0]:.1f} after",
        "none (what a half-busy machine adds to a reply)",
    )


async def seed_known(data: Path, known: int, per_community: int) -> None:
    """Phase run in a child process: many communities that once talked."""
    from storage import Database

    db = await Database.open(data / "sonality.sqlite3")
    embed = default_embedding_function(MODEL_CACHE)
    episodes = list(episode_texts(per_community))
    for i in range(known):
        cid = f"bench:k{i}"
        await db.community(cid).commit(
            StateCommit(state=SpongeState(), cause="seed", change="seed personality")
        )
        await db.touch_community(cid, f"k{i}")
        store = CommunityEpisodeStore.for_community(
            cid, data / "chromadb", embedding_function=embed
        )
        store.store_many(episodes)
    await db.close()


async def measure_active(data: Path, active: int) -> None:
    """Phase run in a fresh child process: open everything, 100 communities talk."""
    import psutil

    process = psutil.Process()
    with llm_server(0.0) as url:
        async with bot(data, url, cap=32) as (runtime, _llm):
            known = len(await runtime.db.community_ids())
            base = process.memory_info().rss
            for start in range(0, active, 10):
                await asyncio.gather(
                    *(
                        runtime.handle(message(Community(id=f"bench:k{i}"), i))
                        for i in range(start, min(active, start + 10))
                    )
                )
            await runtime.drain()
            gc.collect()
            # PSS, not RSS: pages shared with other processes (the loopback LLM's
            # interpreter) count only in part, so it is the memory the bot really holds.
            info = process.memory_full_info()
            loaded = len(runtime.registry.loaded())
            reopens = chroma_reopens(runtime)
    report(
        "4. resident memory",
        f"{info.pss / 2**20:.0f} MB PSS (RSS {info.rss / 2**20:.0f} MB; RSS "
        f"{base / 2**20:.0f} MB before any community talked; Chroma reopened {reopens} times)",
        f"{known:,} known communities with episodes, {loaded} of them active "
        "(one message each, learning finished)",
        "< 500 MB",
        info.pss < 500 * 2**20,
    )


def figure_memory(work: Path, known: int, active: int) -> None:
    data = work / "memory"
    data.mkdir(parents=True)
    for phase in (["seed-known", str(known)], ["measure-active", str(active)]):
        subprocess.run(
            [sys.executable, "-m", "bench", "--phase", *phase, "--data", str(data)],
            cwd=ROOT,
            check=True,
        )


async def figure_cost(work: Path) -> None:
    workload = "60 messages, 4 members: chat, arguments, pressure; {} caching rules"
    sonnet = {"SONALITY_ESS_MODEL": "claude-sonnet-4-6"}
    runs: list[tuple[str, bool, str, dict[str, str]]] = [
        ("defaults: claude-sonnet-4-6 + claude-haiku-4-5", False, "anthropic", {}),
        ("one model: claude-sonnet-4-6 for everything", False, "anthropic", sonnet),
        ("defaults, 100-token replies", True, "anthropic", {}),
        ("one model, 100-token replies", True, "anthropic", sonnet),
        ("OpenAI defaults: gpt-4.1 + gpt-4.1-mini", False, "openai", {}),
        ("OpenAI one model: gpt-4.1", False, "openai", {"SONALITY_ESS_MODEL": "gpt-4.1"}),
    ]
    for index, (label, long_replies, vendor, extra) in enumerate(runs):
        figures = await measure_cost(work / f"cost-{index}", long_replies, vendor, **extra)
        ok = figures.ratio <= 1.3 and figures.sonnet_equivalents <= 1500
        report(
            f"5. cost per message ({label})",
            describe(figures),
            workload.format("OpenAI's" if vendor == "openai" else "Anthropic's")
            + (", replies of about 100 tokens" if long_replies else ""),
            "≤ 1.3× and ≤ 1,500",
            ok if not extra and vendor == "anthropic" else None,
        )
