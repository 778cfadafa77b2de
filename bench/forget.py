"""Figure 7: forgetting one member with 1,000 of a community's 100,000 interactions.

Workload: one community, 100 members speaking in turn (so the forgotten member has 1% of
the messages), 30% of the messages arguments on 20 topics with directions by member,
the rest chat; a decay (the reflection's first step) every 20 messages. The history is
built through the real `CommunityStore` with the engine's own state arithmetic
(`sonality.opinions` and `decay_beliefs`):
one record and one commit per message, with its ESS audit event and its evidence step,
as the agent writes them (no LLM, no Chroma: neither is part of a forget-me's cost in
SQLite and the replay).

Timed: `bot.forget_me.forget_member` as `/sonality forget-me confirm` runs it, from the
journal row to the closed request: the evidence log read and replayed without the
member, the forget-me version committed, the member's rows deleted and their id and
words redacted from every version and audit row, the WAL truncated. Not a timed test:
a figure for the report (target < 10 s). Figure 7b: how long the event loop stalled
during it and during one deleted message's replay (every community's replies wait as
long; target 100 ms, as figure 9's). Figure 7c: a member deleting the message they
just sent, replayed from the stored state before it rather than from the first
message (what posting and deleting costs; target 1 s). Figure 7d: a purge of 20 older
messages at once, which the agent takes back together (target 10 s, 20 whole replays
before). Figure 7e: a member deleting 10 older messages one at a time, each a quarter
longer after the last than 7b's deletion took (one whole replay each before the pause
after a replay; target: the bot's CPU at most half a core meanwhile). The process
holds the bot's program (`app.wiring`) and settles its heap once loaded, as the bot
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.wiring import settle_heap
from bot.deletion import take_back
from bot.forget_me import forget_member
from sonality.agent import WITHDRAWAL_PAUSE_FACTOR, SonalityAgent
from sonality.changes import decay_step, ess_event, message_step
from sonality.config import BELIEF_DECAY_RATE, EngineConfig
from sonality.ess import ESSResult, OpinionDirection, ReasoningType, SourceReliability
from sonality.opinions import apply_due, disagrees, update_opinions, update_topics
from sonality.state import SpongeState
from sonality.store import InteractionRecord, Speaker, StateCommit
from storage import Database

COMMUNITY = "bench:forget"
MEMBERS = 100
TOPICS = [f"topic_{n}" for n in range(20)]
DECAY_EVERY = 20
#: Messages of figure 7d's purge.
PURGED = 20
#: Messages figure 7e's member deletes one at a time.
TRICKLED = 10

Report = Callable[..., None]


class _NoLLM:
    """The agent never calls a model during a forget-me."""

    async def reply(self, **_: Any) -> Any:
        raise AssertionError("a forget-me must not call the model")

    async def call_tool(self, **_: Any) -> Any:
        raise AssertionError("a forget-me must not call the model")


class _NoMemory:
    def embed_many(self, texts: Any) -> list[Any]:
        return []

    def store_many(self, episodes: Any) -> None:
        return None

    def delete(self, ids: Any) -> None:
        return None

    def retrieve_typed(self, *a: Any, **k: Any) -> list[str]:
        return []

    def retrieve(self, *a: Any, **k: Any) -> list[str]:
        return []

    def recent_summaries(self, *a: Any, **k: Any) -> list[str]:
        return []

    def count(self) -> int:
        return 0

    def stored(self, ids: Any) -> list[Any]:
        return []

    def semantic_ids(self, documents: Any) -> list[str]:
        return []


def _ess(rng: random.Random, member: int) -> ESSResult:
    if rng.random() >= 0.3:
        return ESSResult(
            score=0.05,
            reasoning_type=ReasoningType.NO_ARGUMENT,
            source_reliability=SourceReliability.NOT_APPLICABLE,
            internal_consistency=True,
            novelty=0.0,
            topics=(),
            summary="Small talk.",
            opinion_direction=OpinionDirection.NEUTRAL,
        )
    return ESSResult(
        score=rng.uniform(0.4, 0.9),
        reasoning_type=ReasoningType.EMPIRICAL_DATA,
        source_reliability=SourceReliability.PEER_REVIEWED,
        internal_consistency=True,
        novelty=rng.uniform(0.1, 0.9),
        topics=(rng.choice(TOPICS),),
        summary=f"Member {member} cites a study.",
        opinion_direction=OpinionDirection.SUPPORTS if member % 2 else OpinionDirection.OPPOSES,
    )


async def build(db: Database, messages: int, engine: EngineConfig) -> None:
    """The history, learned under `engine` (the forget-me replays it under the same)."""
    store = db.community(COMMUNITY)
    rng = random.Random(11)
    state = SpongeState()
    await store.commit(StateCommit(state=state, cause="seed", change="seed"))
    for n in range(messages):
        member = n % MEMBERS
        speaker = Speaker(id=f"u-member-{member:03d}", name=f"Member {member}")
        record = InteractionRecord(
            id=f"i-{n}",
            speaker=speaker,
            message=f"message {n} from {member}",
            reply="ok",
            message_ref=f"bench:{n}",
        )
        await store.record_interaction(record)
        ess = _ess(rng, member)
        state = state.model_copy(deep=True)
        state.interaction_count += 1
        update_topics(state, ess, config=engine)
        disagreed = disagrees(state, ess)
        apply_due(state)
        update_opinions(
            state,
            ess,
            interaction_id=record.id,
            member=speaker.id,
            version=state.version + 1,
            config=engine,
        )
        state.track_disagreement(disagreed)
        evidence = [message_step(state, record, ess)]
        if state.interaction_count % DECAY_EVERY == 0:
            state.decay_beliefs(BELIEF_DECAY_RATE)
            evidence.append(decay_step(state))
        state.version += 1
        await store.commit(
            StateCommit(
                state=state,
                cause="interaction",
                change=f"ESS {ess.score:.2f}",
                events=[ess_event(state, record, ess, insight=None)],
                interaction_id=record.id,
                evidence=evidence,
            )
        )


class StallWatch:
    """The event loop's longest stall while it runs: a coroutine that asks to wake every
    10 ms and keeps the longest gap past that (every community's replies wait as long)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - before - 0.01)

    async def __aenter__(self) -> StallWatch:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def figure_forget(work: Path, report: Report, messages: int = 100_000) -> None:
    path = work / "forget.sqlite3"
    db = await Database.open(path)
    engine = EngineConfig.from_environment()
    try:
        await build(db, messages, engine)
        agent = await SonalityAgent.load(
            client=_NoLLM(),
            store=db.community(COMMUNITY),
            episodes=_NoMemory(),
            model="m",
            ess_model="m",
            config=engine,
        )
        settle_heap()  # as the bot's process does once loaded (`app.wiring.run_bot`)
        # A member deleting the message they just sent: replayed from the stored state
        # before it, since no replay came after it (figure 7c).
        start = time.perf_counter()
        async with StallWatch() as newest:
            [recent] = await take_back(
                db,
                lambda _: _agent(agent),
                f"bench:{messages - 1}",
                "deleted",
                community_id=COMMUNITY,
            )
        newest_seconds = time.perf_counter() - start
        assert recent.version is not None, "the newest message was learned"
        member = "u-member-007"
        start = time.perf_counter()
        async with StallWatch() as forgetting:
            await forget_member(db, agent, COMMUNITY, member, requested_by="self")
        seconds = time.perf_counter() - start
        # A member deleting one of their learned messages (member 8's last).
        argued = messages - MEMBERS + 8
        start = time.perf_counter()
        async with StallWatch() as deleting:
            [done] = await take_back(
                db, lambda _: _agent(agent), f"bench:{argued}", "deleted", community_id=COMMUNITY
            )
        deletion = time.perf_counter() - start
        assert done.version is not None, "the deleted message was learned: a version replays it"
        # A purge of PURGED older messages (member 9's last ones), handed over at once as
        # Discord's adapter hands over a bulk delete (figure 7d).
        refs = [f"bench:{messages - MEMBERS * k + 9}" for k in range(1, PURGED + 1)]
        # Timed from after the pause 7b's replay leaves (`WITHDRAWAL_PAUSE_FACTOR` times
        # its length): a purge right after a deletion waits that long first.
        await asyncio.sleep(WITHDRAWAL_PAUSE_FACTOR * deletion)
        start = time.perf_counter()
        async with StallWatch() as purging:
            taken = await asyncio.gather(
                *(
                    take_back(db, lambda _: _agent(agent), ref, "deleted", community_id=COMMUNITY)
                    for ref in refs
                )
            )
        purge = time.perf_counter() - start
        replays = {d.version for found in taken for d in found}
        assert None not in replays and sum(map(len, taken)) == PURGED, "all were learned"
        # Member 10's last ones, deleted one at a time (figure 7e).
        gap = 1.25 * deletion
        cpu, start = time.process_time(), time.perf_counter()
        pending = []
        for k in range(1, TRICKLED + 1):
            ref = f"bench:{messages - MEMBERS * k + 10}"
            pending.append(
                asyncio.create_task(
                    take_back(db, lambda _: _agent(agent), ref, "deleted", community_id=COMMUNITY)
                )
            )
            await asyncio.sleep(gap)
        trickled = await asyncio.gather(*pending)
        trickle_cpu, trickle_wall = time.process_time() - cpu, time.perf_counter() - start
        trickle_replays = {d.version for found in trickled for d in found}
        assert None not in trickle_replays and sum(map(len, trickled)) == TRICKLED
        await agent.close(grace_seconds=5)
    finally:
        await db.close()
    history = (
        f"a community's {messages:,} interactions ({MEMBERS} members, 30% arguments on "
        f"{len(TOPICS)} topics, a decay every {DECAY_EVERY}; SQLite and replay, no Chroma)"
    )
    report(
        "7",
        f"{seconds:.2f} s",
        f"forget one member with {messages // MEMBERS:,} of {history}",
        "< 10 s",
        seconds < 10,
    )
    report(
        "7b. event loop's worst stall (every community's replies wait as long)",
        f"forget-me {forgetting.worst * 1000:.0f} ms; one deleted message "
        f"{deleting.worst * 1000:.0f} ms (the deletion took {deletion:.2f} s)",
        f"figure 7's forget-me, then a member deleting one learned message of {history}",
        "≤ 100 ms",
        max(forgetting.worst, deleting.worst) <= 0.1,
    )
    report(
        "7c. a member deleting the message they just sent (replayed from the state before it)",
        f"{newest_seconds * 1000:.0f} ms (event loop's worst stall {newest.worst * 1000:.0f} ms)",
        f"the newest of {history}, before figure 7's forget-me",
        "< 1 s",
        newest_seconds < 1,
    )
    report(
        f"7d. a purge of {PURGED} older messages at once",
        f"{purge:.2f} s in {len(replays)} replays (event loop's worst stall "
        f"{purging.worst * 1000:.0f} ms); one at a time, each was a whole replay as 7b's",
        f"{PURGED} learned messages of one member, deleted together in {history} after "
        "figure 7's forget-me",
        "< 10 s",
        purge < 10,
    )
    report(
        f"7e. a member deleting {TRICKLED} older messages one at a time",
        f"{len(trickle_replays)} replays, {trickle_cpu:.1f} s of CPU in {trickle_wall:.1f} s "
        f"({trickle_cpu / trickle_wall:.0%} of a core)",
        f"one every {gap:.2f} s (1.25 × 7b's deletion), {TRICKLED} learned messages of one "
        f"member in {history} after figure 7d",
        "≤ 50% of a core",
        trickle_cpu / trickle_wall <= 0.5,
    )


async def _agent(agent: SonalityAgent) -> SonalityAgent:
    return agent


if __name__ == "__main__":  # a quick look: python -m bench.forget [messages]
    import sys
    import tempfile

    def _print(name: str, value: str, workload: str, target: str, ok: bool | None = None) -> None:
        print(f"{name}: {value}  ({workload}; target {target})  ok={ok}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(
            figure_forget(Path(tmp), _print, int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
        )
