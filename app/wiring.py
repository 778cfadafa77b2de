"""Wiring: settings in, a running runtime (and its platforms) out.

`open_runtime` is the seam tests and benchmarks use: the same assembly as production,
with the LLM client swappable for one pointed at a loopback server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.health import LLMHealth, RecordingLLM, health_endpoint
from app.startup import engine_config, require_llm_key
from bot.budget import BudgetLedger, MeteredLLM, Spender
from bot.deletion import reapply_deletions, resume_deletions
from bot.forget_journal import ForgetJournalError
from bot.forget_me import reapply_journal, resume_forgets
from bot.interface import Adapter, StartupError
from bot.messages import Community
from bot.registry import CommunityRegistry
from bot.runtime import Runtime
from bot.scheduler import ReflectionScheduler
from bot.settings import Settings
from chroma_memory.embed_lane import EmbeddingLane
from chroma_memory.embedding import default_embedding_function
from chroma_memory.hosts import LocalMemory, MemoryHost
from chroma_memory.priority import ReplyPriority
from chroma_memory.server import ServerMemory, ServerUnreachable
from chroma_memory.write_behind import WriteBehindMemory
from providers.anthropic import AnthropicLLM
from providers.levels import LEVELS_FILE
from sonality.agent import SonalityAgent
from sonality.llm import LLMClient
from sonality.store import InteractionRecord
from storage import Database, StorageError, open_database
from storage.chroma_log import index_chroma_log
from storage.models import usage_role

if TYPE_CHECKING:
    from providers.openai import OpenAILLM

log = logging.getLogger(__name__)


def build_llm(settings: Settings, *, levels_file: Path | None = None) -> AnthropicLLM | OpenAILLM:
    """The one shared client of the vendor SONALITY_LLM_PROVIDER names.

    Anthropic cannot work without a key; an OpenAI-compatible server may need none
    (Ollama), and one that does answers 401, which the start-up check reports.
    `levels_file` keeps what each model needed for structured answers across restarts.
    """
    caps = settings.output_caps

    def output_cap(purpose: str) -> int | None:
        return caps[usage_role(purpose)]

    if settings.llm_provider == "openai":
        # Imported here: the OpenAI SDK costs the Anthropic-only bot about 13 MB.
        from providers.openai import OpenAILLM

        key = settings.openai_api_key
        return OpenAILLM(
            api_key=key.get_secret_value() if key is not None else "",
            base_url=settings.openai_base_url,
            default_model=settings.model,
            max_retries=settings.llm_max_retries,
            timeout=settings.llm_timeout,
            max_concurrency=settings.max_concurrent_llm,
            output_cap=output_cap,
            model_options=settings.resolved_model_options,
            levels_file=levels_file,
        )
    require_llm_key(settings)  # the start-up rule: Anthropic needs a key, not blank
    assert settings.anthropic_api_key is not None
    return AnthropicLLM(
        api_key=settings.anthropic_api_key.get_secret_value(),
        base_url=settings.anthropic_base_url,
        default_model=settings.model,
        max_retries=settings.llm_max_retries,
        timeout=settings.llm_timeout,
        max_concurrency=settings.max_concurrent_llm,
        output_cap=output_cap,
    )


@contextlib.asynccontextmanager
async def open_runtime(
    settings: Settings, llm: LLMClient | None = None, llm_health: LLMHealth | None = None
) -> AsyncIterator[Runtime]:
    """Open storage, memory and the engine; yield the runtime; close it all cleanly.

    Every call of the shared client is noted in `llm_health` (for the health check).

    Each resource's close is registered as soon as it is open, so a failure part-way
    through start-up closes what was opened, in reverse order.
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        if llm is None:
            owned = build_llm(settings, levels_file=settings.data_dir / LEVELS_FILE)
            stack.push_async_callback(owned.aclose)
            llm = owned
        client = RecordingLLM(llm, llm_health or LLMHealth())  # still just an LLMClient
        db = await open_database(
            url=settings.postgres_url,
            path=settings.resolved_database_path,
            timezone=settings.timezone,
        )
        stack.push_async_callback(db.close)
        await use_secret_key(db, settings)
        embed = await asyncio.to_thread(
            default_embedding_function,
            settings.resolved_model_cache_dir,
            quantized=settings.embedding_int8,
        )
        memory = await asyncio.to_thread(open_memory, settings)
        # Closed after the agents (below) have written their episodes.
        stack.push_async_callback(asyncio.to_thread, memory.close)
        priority = ReplyPriority()  # one per runtime: any reply outranks any memory write
        lane = EmbeddingLane(embed)  # one per runtime: messages waiting together embed together
        stack.callback(lane.close)
        budget = BudgetLedger.from_settings(db, settings)  # one per runtime: today's spend
        engine = engine_config(settings)  # one per runtime: every agent follows it

        async def load_agent(community: Community) -> SonalityAgent:
            episodes = await asyncio.to_thread(memory.store_for, community.id, embed)
            store = db.community(community.id)
            # Each community's calls are checked against its daily limit and counted, for
            # the member whose message they serve.
            metered = MeteredLLM(client, budget, community.id)
            agent = await SonalityAgent.load(
                client=metered,
                store=store,
                episodes=WriteBehindMemory(
                    episodes,
                    lane=lane,
                    priority=priority,
                    label=community.id,
                    # Other processes forget members too: see storage.community.EpisodeGuard.
                    guard=store.episode_guard(),
                    flush_delay=settings.episode_flush_seconds,
                    config=engine,
                ),
                label=community.id,
                config=engine,
            )
            # Set before learning's first step: `load` queues the outbox and returns.
            metered.learning_member = lambda: _speaker(agent.learning.current)
            return agent

        registry = CommunityRegistry(load_agent, settings.agent_idle_evict_minutes * 60)
        runtime = Runtime(settings, db, registry, memory, budget)
        stack.push_async_callback(runtime.close)
        runtime.removals.forget_memory = _memory_eraser(memory)
        await runtime.removals.load()
        # A forget-me or a message deletion a crash interrupted, or one a restored
        # database lacks (the journal file outside it has it), is finished before
        # anything else is learned.
        try:
            await asyncio.to_thread(runtime.forget_journal.ensure)
            forgets, deletions = await asyncio.to_thread(runtime.forget_journal.read)
            await reapply_journal(db, forgets)
            await reapply_deletions(db, deletions)
        except (OSError, ForgetJournalError) as exc:
            raise StartupError(f"forget journal: {exc}") from None
        await resume_forgets(db, registry.agent_by_id, runtime.forget_journal)
        await resume_deletions(db, registry.agent_by_id)
        await _resume_unfinished(db, registry)
        yield runtime


def _speaker(record: InteractionRecord | None) -> Spender | None:
    """Whose message learning works on, and when it came in (`Spender.since`)."""
    return None if record is None else Spender(record.speaker.id, since=record.created_at)


def _memory_eraser(memory: MemoryHost) -> Callable[[str], Awaitable[None]]:
    """Deleting a removed community's Chroma collections, off the event loop."""

    async def forget(community_id: str) -> None:
        await asyncio.to_thread(memory.drop_community, community_id)

    return forget


async def use_secret_key(db: Database, settings: Settings) -> None:
    """Hand the key to storage; plain rows of an older file are encrypted now."""
    if settings.secret_key is None:
        return
    try:
        encrypted = await db.use_secret_key(settings.secret_key.get_secret_value())
    except StorageError as err:
        raise StartupError(str(err)) from None
    if encrypted:
        log.info("encrypted %d stored Slack installation(s) with SONALITY_SECRET_KEY", encrypted)


def open_memory(settings: Settings) -> MemoryHost:
    """Chroma for every community: a Chroma server with CHROMA_URL, else in this
    process. One client, reopened (embedded only) when too many memory indexes are
    open; Chroma's write log indexed once its file exists (storage.chroma_log)."""
    if settings.chroma_url is not None:
        return open_server_memory(settings)
    memory = LocalMemory(settings.resolved_chroma_dir, max_open=settings.chroma_max_open)
    index_chroma_log(settings.resolved_chroma_dir)
    return memory


def open_server_memory(settings: Settings) -> MemoryHost:
    """The Chroma server at CHROMA_URL; one line and exit 2 if it cannot be reached,
    since a bot that answers with no memory at all is worse than one that says why."""
    url = settings.chroma_url
    assert url is not None
    try:
        memory = ServerMemory(
            url, database=settings.chroma_database, timeout=settings.chroma_timeout_seconds
        )
    except ServerUnreachable as err:
        raise StartupError(f"could not reach the Chroma server CHROMA_URL={url} ({err})") from None
    log.info("episodes are kept by the Chroma server at %s", url)
    return memory


async def _resume_unfinished(db: Database, registry: CommunityRegistry) -> None:
    """Load every community with answered-but-unprocessed messages, so they replay now."""
    for community_id in await db.community_ids():
        if await db.community(community_id).pending_count():
            await registry.agent_for(Community(id=community_id))


def _adapters(settings: Settings, runtime: Runtime) -> list[Adapter]:
    adapters: list[Adapter] = []
    if settings.discord_enabled:
        from adapters.discord import DiscordAdapter

        adapters.append(DiscordAdapter(runtime, settings))
    if settings.slack_enabled:
        from adapters.slack import SlackAdapter

        adapters.append(SlackAdapter(runtime, settings, runtime.db))
    if not adapters:
        from adapters.terminal import TerminalAdapter

        adapters.append(TerminalAdapter(runtime, settings))
    return adapters


def settle_heap() -> None:
    """Take what start-up made (modules, classes, settings: about 250,000 objects that
    live as long as the process) out of the garbage collector's sight, once the
    program is loaded. Every full collection walked them all, holding every thread
    meanwhile: a forget-me or a deleted message in a community of 20,000 interactions,
    whose parse sets off several, stalled every community's replies for 146-155 ms;
    17-25 ms after this (bench figure 7b). Garbage is collected first, so nothing frozen
    is already garbage; objects made later are collected as before."""
    gc.collect()
    gc.freeze()


async def run_bot(settings: Settings) -> int:
    """Run until SIGINT/SIGTERM (or end of input in the terminal); returns an exit code.
    The settings, the storage and the model were checked first (`app.startup.run`)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    llm_health = LLMHealth()
    async with (
        open_runtime(settings, llm_health=llm_health) as runtime,
        health_endpoint(settings, runtime.db, llm_health) as health,  # off: not serving
    ):
        scheduler = ReflectionScheduler(runtime)
        scheduler.start()
        adapters = _adapters(settings, runtime)
        settle_heap()
        tasks: dict[asyncio.Task[Any], Adapter] = {
            asyncio.create_task(a.start(), name=f"adapter:{a.name}"): a for a in adapters
        }
        health.watch(tasks)
        stopper = asyncio.create_task(stop.wait(), name="stop-signal")
        code = 0
        try:
            done, _ = await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task not in tasks or task.cancelled():
                    continue
                exc = task.exception()
                if isinstance(exc, StartupError):
                    print(f"error: {exc}", file=sys.stderr, flush=True)
                    code = 2
                elif exc is not None:
                    log.error("%s adapter stopped", tasks[task].name, exc_info=exc)
                    code = 1
        finally:
            log.info("shutting down")
            await scheduler.stop()  # no reflection or housekeeping while things close
            runtime.stop_accepting()
            for adapter in adapters:
                with contextlib.suppress(Exception):
                    await adapter.close()
            for task in [*tasks, stopper]:
                task.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)
        return code
