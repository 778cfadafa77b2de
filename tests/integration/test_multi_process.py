"""Two real bot processes on one PostgreSQL and one Chroma server, Slack in HTTP mode.

Each process is `python -m app` with the same DATABASE_URL and CHROMA_URL, its own
SLACK_PORT and its own data directory (logs and the process lock only); the test plays
the load balancer, posting each signed Events API request to one process or the other,
as any worker may receive any workspace's event. Slack is the loopback fake, the model
the loopback Anthropic fake shared by both processes. What was learned is read back
from PostgreSQL: the outbox order (`interactions.seq`), the evidence log and the
personality versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import chromadb
import pytest

from app.wiring import open_runtime
from bot import budget
from bot.messages import ReplyKind
from bot.runtime import Runtime
from bot.scheduler import ReflectionScheduler
from sonality.evidence import MESSAGE
from storage import Database
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401 (fixture)
from tests.fakes.anthropic_server import AnthropicFake, Delay, RecordedRequest, Text
from tests.fakes.slack_server import FakeSlack, post_signed
from tests.forked_bot import ChildProcess
from tests.integration.conftest import (
    A,
    command,
    ess_requests,
    eventually,
    make_settings,
    say,
)
from tests.integration.test_budget import (
    EVIDENCE_MODEL,
    PRICES,
    REPLY_MODEL,
    kind,
    price_replies,
    release,
    send,
)
from tests.integration.test_logging import Output
from tests.integration.test_process import _start_bot
from tests.pg import PostgresServer
from tests.slack.conftest import (  # noqa: F401 (fixtures "fake", "http")
    BOT_TOKEN,
    SECRET,
    command_form,
    fake_slack,
    http_session,
    mention_event,
)

REPO = Path(__file__).resolve().parents[2]
TEAM = "T1"
COMMUNITY = f"slack:{TEAM}"
WAIT = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class BotProcess:
    proc: ChildProcess
    port: int
    out: Output
    err: Output
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"


@dataclass
class TwoBotStack:
    tmp: Path
    database_url: str
    chroma_url: str
    chroma_database: str
    anthropic: AnthropicFake
    slack: FakeSlack
    http: aiohttp.ClientSession
    bots: list[BotProcess] = field(default_factory=list)
    _ts: int = 0

    async def start(self, name: str, **extra: str) -> BotProcess:
        port = free_port()
        proc = await _start_bot(
            self.tmp / f"data-{name}",
            self.anthropic.base_url,
            self.tmp,
            asyncio.subprocess.DEVNULL,
            PYTHONPATH=str(REPO),  # the worktree's code, whatever is installed
            DATABASE_URL=self.database_url,
            CHROMA_URL=self.chroma_url,
            SONALITY_CHROMA_DATABASE=self.chroma_database,
            SLACK_BOT_TOKEN=BOT_TOKEN,
            SLACK_SIGNING_SECRET=SECRET,
            SLACK_API_URL=self.slack.base_url,
            SLACK_PORT=str(port),
            SONALITY_IDLE_CHECK_SECONDS="1",  # the housekeeping sweep, every second
            SONALITY_NIGHTLY_JITTER_SECONDS="0",
            # One member sends every message of these tests, and the flood limit holds
            # across the processes; a test about flood control sets its own.
            **{"SONALITY_RATE_LIMIT_MESSAGES": "10000", **extra},
        )
        assert proc.stdout is not None and proc.stderr is not None
        bot = BotProcess(proc, port, Output(), Output())
        bot.readers = [
            asyncio.create_task(bot.out.read(proc.stdout)),
            asyncio.create_task(bot.err.read(proc.stderr)),
        ]
        self.bots.append(bot)
        await self._ready(bot)
        return bot

    async def _ready(self, bot: BotProcess) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while loop.time() < deadline:
            if bot.proc.returncode is not None:
                raise AssertionError(f"the bot exited: {bot.err.lines[-10:]}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", bot.port)
                writer.close()
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"the bot never listened on {bot.port}: {bot.err.lines[-10:]}")

    def next_ts(self) -> str:
        self._ts += 1
        return f"1700000{self._ts:03d}.000100"

    async def mention(
        self,
        bot: BotProcess,
        text: str,
        *,
        event_id: str | None = None,
        user: str = "U1",
        team: str = TEAM,
    ) -> str:
        """Post an @mention to `bot`; returns its ts (the reply's thread)."""
        ts = self.next_ts()
        body = mention_event(event_id=event_id or f"Ev{ts}", team=team, ts=ts, text=text, user=user)
        status, _, _ = await post_signed(self.http, bot.url, SECRET, json_body=body)
        assert status == 200
        return ts

    async def command(
        self, bot: BotProcess, text: str, *, user: str, team: str = TEAM
    ) -> dict[str, Any]:
        """/sonality `text` posted to `bot`; returns the answer sent to its response_url."""
        rid = f"r{len(self.slack.responses) + 1}"
        form = command_form(self.slack, text, user=user, team=team, rid=rid)
        status, _, _ = await post_signed(self.http, bot.url, SECRET, form=form)
        assert status == 200
        await self.slack.wait_for(
            lambda: self.slack.responses.get(rid), what=f"/sonality {text}", within=WAIT
        )
        [answer] = self.slack.responses[rid]
        return answer

    def replies_to(self, ts: str) -> list[dict[str, Any]]:
        return [p for p in self.slack.posts() if p.get("thread_ts") == ts]

    async def answered(self, ts: str) -> None:
        await self.slack.wait_for(lambda: self.replies_to(ts), what=f"reply to {ts}", within=WAIT)

    async def stop(self) -> list[int]:
        for bot in self.bots:
            if bot.proc.returncode is None:
                bot.proc.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(b.proc.wait(), 60) for b in self.bots]
        await asyncio.gather(*(t for b in self.bots for t in b.readers))
        return codes


@pytest.fixture
async def two_bots(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    anthropic_server: AnthropicFake,
    fake: FakeSlack,
    http: aiohttp.ClientSession,
) -> AsyncIterator[TwoBotStack]:
    url = postgres_server.new_database()
    running = TwoBotStack(
        tmp_path,
        url,
        chroma_server.url,
        chroma_server.fresh_database(),
        anthropic_server,
        fake,
        http,
    )
    try:
        yield running
    finally:
        for bot in running.bots:
            if bot.proc.returncode is None:
                bot.proc.kill()
                await bot.proc.wait()
        postgres_server.drop(url)


async def until_learned(db: Database, seconds: float = WAIT, community: str = COMMUNITY) -> None:
    store = db.community(community)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if not await store.pending_count():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{await store.pending_count()} interaction(s) never learned")


async def outbox_messages(db: Database) -> list[tuple[str, str]]:
    """(id, message) of every answered interaction, in the order they were recorded."""
    rows = await db._fetchall(
        "SELECT id, message FROM interactions WHERE community_id = ? ORDER BY seq",
        (COMMUNITY,),
    )
    return [(str(r[0]), str(r[1])) for r in rows]


async def learned_ids(db: Database) -> list[str]:
    steps = await db.community(COMMUNITY).evidence()
    return [s.interaction_id or "" for s in steps if s.kind == MESSAGE]


async def test_one_workspace_spread_over_two_processes_is_learned_once_in_order(
    two_bots: TwoBotStack,
) -> None:
    a = await two_bots.start("a")
    b = await two_bots.start("b")
    sent = []
    for i in range(8):  # alternating, as a load balancer would
        text = f"<@UBOT> message number {i}"
        ts = await two_bots.mention(a if i % 2 == 0 else b, text)
        await two_bots.answered(ts)
        sent.append((ts, text))
    # One event delivered to both (Slack retried it to another worker): answered once.
    dup = await two_bots.mention(a, "<@UBOT> delivered twice", event_id="EvTwice")
    await two_bots.answered(dup)
    status, _, _ = await post_signed(
        two_bots.http,
        b.url,
        SECRET,
        json_body=mention_event(
            event_id="EvTwice", team=TEAM, ts=dup, text="<@UBOT> delivered twice"
        ),
        retry_num=1,
    )
    assert status == 200

    db = await Database.open_url(two_bots.database_url)
    try:
        await until_learned(db)
        await two_bots.slack.settle(quiet=0.5)
        for ts, _ in [*sent, (dup, "")]:
            assert len(two_bots.replies_to(ts)) == 1, ts
        recorded = await outbox_messages(db)
        # Stored without the mention of the bot.
        expected = [t.removeprefix("<@UBOT> ") for _, t in sent] + ["delivered twice"]
        assert [m for _, m in recorded] == expected
        # Learned in the order answered: no gap, no duplicate, whichever process learned.
        assert await learned_ids(db) == [i for i, _ in recorded]
        versions = sorted(
            await db.community(COMMUNITY).versions(limit=100), key=lambda v: v.version
        )
        assert [v.version for v in versions] == list(range(len(recorded) + 1))
        assert [v.interaction_count for v in versions if v.cause == "interaction"] == list(
            range(1, len(recorded) + 1)
        )
        assert len(ess_requests(two_bots.anthropic)) == len(recorded)  # each classified once
    finally:
        await db.close()
    assert await two_bots.stop() == [0, 0], [bot.err.lines[-10:] for bot in two_bots.bots]


async def test_a_process_killed_mid_learning_leaves_its_work_to_the_other_once(
    two_bots: TwoBotStack,
) -> None:
    a = await two_bots.start("a")
    b = await two_bots.start("b")
    # a answers; the classification of that message then hangs, and a is killed.
    two_bots.anthropic.enqueue(Text("Interesting point."), Delay(60))
    ts = await two_bots.mention(a, "<@UBOT> the reactor fleet data says nuclear is safe")
    await two_bots.answered(ts)
    assert await eventually(lambda: bool(ess_requests(two_bots.anthropic)), seconds=WAIT)
    os.kill(a.proc.pid, signal.SIGKILL)
    await a.proc.wait()

    db = await Database.open_url(two_bots.database_url)
    try:
        await until_learned(db)  # b's housekeeping finds the row its learner left
        later = await two_bots.mention(b, "<@UBOT> and one more thing")
        await two_bots.answered(later)
        await until_learned(db)
        recorded = await outbox_messages(db)
        assert len(recorded) == 2
        assert await learned_ids(db) == [i for i, _ in recorded]
        causes = [v.cause for v in await db.community(COMMUNITY).versions(limit=10)]
        assert causes == ["interaction", "interaction", "seed"]
        # The killed attempt, then one each for the two messages: nothing learned twice.
        assert len(ess_requests(two_bots.anthropic)) == 3
    finally:
        await db.close()
    assert (await two_bots.stop())[1] == 0, two_bots.bots[1].err.lines[-10:]


NIGHTLY_SKIPPED = "nightly reflection: another process runs it"
NIGHTLY_RAN = "community(ies) reflected"  # "nightly reflection: 3 of 3 community(ies) ..."


async def nightly_outcome(bot: BotProcess) -> str:
    """The line `bot` logs when its nightly job has ended, whichever way it went."""
    return await bot.out.wait_for(
        lambda line: NIGHTLY_SKIPPED in line or NIGHTLY_RAN in line, "a nightly outcome"
    )


async def talk_in(
    stack: TwoBotStack, db: Database, bots: list[BotProcess], teams: list[str]
) -> None:
    """One answered and learned @mention in each workspace, spread over `bots`."""
    for i, team in enumerate(teams):
        ts = await stack.mention(
            bots[i % len(bots)],
            f"<@UBOT> a randomised trial in {team} says tutoring helps",
            team=team,
        )
        await stack.answered(ts)
    for team in teams:
        await until_learned(db, community=f"slack:{team}")


@dataclass
class NightlyPair:
    bots: list[BotProcess]
    since: datetime  # when they were started: what they reflect is created after
    asked: int  # model requests before they were started


async def start_both_for_nightly(
    stack: TwoBotStack, db: Database, teams: list[str], ahead: float
) -> NightlyPair:
    """Start both processes with the nightly run `ahead` seconds from now, to the second,
    and return them once both have scheduled it for then.

    A process that came up after that second plans tomorrow's run instead, and the
    punctual one runs the job alone: then, once that run has ended, every workspace
    talks again (so every community is due again), both stop, and both start again
    further ahead. A slow start costs time, never a wrong result."""
    for _ in range(3):
        due = await db.communities_needing_nightly()
        assert due == [f"slack:{team}" for team in teams], due
        since, asked = datetime.now(UTC), len(stack.anthropic.requests)
        fire = (since + timedelta(seconds=ahead)).replace(microsecond=0)
        setting = {"SONALITY_NIGHTLY_TIME": f"{fire:%H:%M:%S}"}
        bots = list(await asyncio.gather(stack.start("a", **setting), stack.start("b", **setting)))
        planned = f"next nightly reflection: {fire:%Y-%m-%d %H:%M:%S} UTC"
        punctual = [
            bot
            for bot in bots
            if (
                await bot.out.wait_for(lambda line: "next nightly reflection: " in line, "a plan")
            ).endswith(planned)
        ]
        if len(punctual) == len(bots):
            return NightlyPair(bots, since, asked)
        for bot in punctual:
            await nightly_outcome(bot)
        await talk_in(stack, db, bots, teams)
        assert await stack.stop() == [0] * len(stack.bots), "a late start must stop cleanly"
        ahead *= 2
    raise AssertionError(f"the processes never started {ahead / 2:.0f}s ahead of the run")


async def test_two_processes_reflect_each_community_once_at_the_nightly_time(
    two_bots: TwoBotStack,
) -> None:
    """Two `python -m app` processes on one database, both with the nightly run at the
    same second: each community that talked is reflected once, by one of them; the other
    says it skipped the run, and both go on serving."""
    teams = ["T1", "T2", "T3"]
    communities = [f"slack:{team}" for team in teams]
    loop = asyncio.get_running_loop()
    db = await Database.open_url(two_bots.database_url)
    try:
        # Talk first, with the nightly run half a day away.
        far = {"SONALITY_NIGHTLY_TIME": f"{datetime.now(UTC) + timedelta(hours=12):%H:%M}"}
        began = loop.time()
        bots = await asyncio.gather(two_bots.start("a", **far), two_bots.start("b", **far))
        start_seconds = loop.time() - began
        await talk_in(two_bots, db, list(bots), teams)
        assert await two_bots.stop() == [0, 0]

        # The model is slow (the checks at start do not call it): a nightly run lasts
        # seconds, so two processes that both ran the job would overlap.
        two_bots.anthropic.latency = 0.5
        # Twice what a start took, at least 8 s; a late start retries further ahead.
        pair = await start_both_for_nightly(two_bots, db, teams, max(8.0, 2 * start_seconds))
        outcomes = [await nightly_outcome(bot) for bot in pair.bots]

        # Both jobs have ended: what the database holds now is the whole result.
        for community in communities:
            store = db.community(community)
            nightly = [
                e
                for e in await store.audit_events(kind="reflection")
                if e.payload.get("trigger") == "nightly" and e.created_at >= pair.since
            ]
            assert len(nightly) == 1, (community, nightly)
            reflected = [
                v
                for v in await store.versions(limit=100)
                if v.cause == "reflection" and v.created_at >= pair.since
            ]
            assert len(reflected) == 1, (community, reflected)
        reflections = [
            r
            for r in two_bots.anthropic.requests[pair.asked :]
            if "current_self_description" in r.user_text
        ]
        assert len(reflections) == len(communities)
        assert await db.communities_needing_nightly() == []
    finally:
        await db.close()
    # One process says it ran the job, the other that it skipped it.
    ran = [line for line in outcomes if NIGHTLY_RAN in line]
    skipped = [line for line in outcomes if NIGHTLY_SKIPPED in line]
    assert len(ran) == 1 and len(skipped) == 1, outcomes
    assert ran[0].endswith(f"nightly reflection: 3 of 3 {NIGHTLY_RAN}"), ran
    # Both go on serving, then stop cleanly.
    two_bots.anthropic.latency = 0.0
    for bot in pair.bots:
        assert bot.proc.returncode is None
        await two_bots.answered(await two_bots.mention(bot, "<@UBOT> still there?"))
    assert await two_bots.stop() == [0] * len(two_bots.bots), [
        bot.out.lines[-10:] for bot in two_bots.bots
    ]


@contextlib.asynccontextmanager
async def two_runtimes(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma: ChromaServer,
    llm: Any,
    **settings: Any,
) -> AsyncIterator[tuple[Runtime, Runtime]]:
    """Two runtimes in this process: two PostgreSQL sessions each, as two processes."""
    url = postgres_server.new_database()
    shared = {
        "DATABASE_URL": url,
        "CHROMA_URL": chroma.url,
        "SONALITY_CHROMA_DATABASE": chroma.fresh_database(),
        **settings,
    }
    try:
        async with (
            open_runtime(make_settings(tmp_path / "a", llm=llm, **shared), llm=llm) as one,
            open_runtime(make_settings(tmp_path / "b", llm=llm, **shared), llm=llm) as two,
        ):
            yield one, two
    finally:
        postgres_server.drop(url)


async def test_the_nightly_job_of_two_runtimes_runs_once(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    anthropic_server: AnthropicFake,
    llm: Any,
) -> None:
    """Both nightly jobs start at the same moment, and the community is reflected once.
    The quick, in-process twin of the test above: the two jobs are started together by
    hand, so their overlap does not depend on two schedulers' timing."""
    async with two_runtimes(tmp_path, postgres_server, chroma_server, llm) as (one, two):
        await say(one, "hello from the first process", community=A)
        await say(two, "and hello from the second", community=A)
        await one.drain()
        await two.drain()
        anthropic_server.latency = 0.3  # the jobs overlap
        later = datetime.now(UTC) + timedelta(hours=1)
        first, second = await asyncio.gather(
            ReflectionScheduler(one).run_nightly(later),
            ReflectionScheduler(two).run_nightly(later),
        )
        assert sorted(first + second) == [A.id]
        reflections = [
            r for r in anthropic_server.requests if "current_self_description" in r.user_text
        ]
        assert len(reflections) == 1
        assert len(await one.db.community(A.id).audit_events(kind="reflection")) == 1


async def test_a_command_in_one_process_shows_what_the_other_learned(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    llm: Any,
) -> None:
    async with two_runtimes(tmp_path, postgres_server, chroma_server, llm) as (one, two):
        await say(two, "the second process hears this first", community=A)
        for i in range(3):
            await say(one, f"the first process hears message {i}", community=A)
        await until_learned(one.db, community=A.id)
        status = await command(two, "status")
        assert "Interactions: 4" in status.text, status.text


async def test_a_daily_limit_spent_through_one_process_stops_the_other(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    anthropic_server: AnthropicFake,
    llm: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(budget, "SHARED_SYNC_SECONDS", 0.0)  # take in stored spend at once
    price_replies(anthropic_server, 1, 6)
    priced = {
        "SONALITY_MODEL": REPLY_MODEL,
        "SONALITY_ESS_MODEL": EVIDENCE_MODEL,
        "SONALITY_PRICES": PRICES,
        "SONALITY_DAILY_BUDGET_USD": 5,
    }
    async with two_runtimes(tmp_path, postgres_server, chroma_server, llm, **priced) as (
        one,
        two,
    ):
        assert kind(await send(two, "cost1 hello")) is ReplyKind.ANSWER  # two knows A: $1
        assert kind(await send(one, "cost6 a long one")) is ReplyKind.ANSWER  # $7 of $5
        assert kind(await send(two, "cost1 still there?")) is ReplyKind.NOTICE
        await release(one)
        await release(two)


def chroma_documents(stack: TwoBotStack) -> dict[str, str]:
    """Every record in the bots' Chroma database, id to document, read over HTTP."""
    parts = stack.chroma_url.rsplit(":", 1)
    client = chromadb.HttpClient(
        host="127.0.0.1", port=int(parts[1]), database=stack.chroma_database
    )
    found: dict[str, str] = {}
    for collection in client.list_collections():
        got = collection.get(include=["documents"])
        found.update(zip(got["ids"], [d or "" for d in got["documents"] or []], strict=True))
    return found


def section(text: str, tag: str) -> str | None:
    found = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    return None if found is None else html.unescape(found.group(1).strip())


def memories_in(request: RecordedRequest) -> str:
    """The recalled memories a reply request carried (its last turn's section)."""
    return section(request.last_user_text, "relevant_memories") or ""


def reply_request(anthropic: AnthropicFake, said: str) -> RecordedRequest:
    """The reply request whose member message is `said` (the one reply to it)."""
    [found] = [
        r
        for r in anthropic.requests
        if r.tool_name is None and section(r.last_user_text, "message") == said
    ]
    return found


FORGOTTEN = "marmotlantern71"
KEPT = "pelicanharbor36"


async def test_a_member_forgotten_in_one_process_is_not_written_back_by_the_other(
    two_bots: TwoBotStack,
) -> None:
    """b learns two members' messages and holds their episodes in its write-behind queue
    (a flush delay longer than the test); a handles the first member's forget-me. b's
    next reply recalls the other member's waiting episode but not the forgotten one's
    (issue 22: it did, until its next batch). Then b stops, writing what it holds. The
    forgotten member's episode must not reach Chroma; the other member's must."""
    for token in (FORGOTTEN, KEPT):
        two_bots.anthropic.brain.ess_rule(
            contains=token,
            score=0.8,
            reasoning_type="empirical_data",
            topics=["remote_work"],
            direction="supports",
            summary=f"The sender cites the {token} study about remote work.",
        )
    b = await two_bots.start("b", SONALITY_EPISODE_FLUSH_SECONDS="3600")
    for token, user in ((FORGOTTEN, "U1"), (KEPT, "U2")):
        ts = await two_bots.mention(b, f"<@UBOT> the {token} study says remote works", user=user)
        await two_bots.answered(ts)
    db = await Database.open_url(two_bots.database_url)
    try:
        await until_learned(db)  # learned by b, the only process
        (forgotten_id, _), (kept_id, _) = await outbox_messages(db)
        waiting = {e.id for e in await db.community(COMMUNITY).pending_episodes()}
        assert waiting == {forgotten_id, kept_id}  # committed, not yet written
        assert forgotten_id not in chroma_documents(two_bots)  # b still holds it

        a = await two_bots.start("a")
        done = await two_bots.command(a, "forget-me confirm", user="U1")
        assert "forgot" in done["text"].lower(), done
        assert not any(FORGOTTEN in d for d in chroma_documents(two_bots).values())
        said = "which study about remote work did you hear of?"
        await two_bots.answered(await two_bots.mention(b, f"<@UBOT> {said}", user="U3"))
        recalled = memories_in(reply_request(two_bots.anthropic, said))
        assert KEPT in recalled and FORGOTTEN not in recalled, recalled
    finally:
        await db.close()
    # b writes what it holds as it stops; a then writes what it adopted.
    assert await two_bots.stop() == [0, 0], [bot.err.lines[-10:] for bot in two_bots.bots]
    stored = chroma_documents(two_bots)
    assert forgotten_id not in stored
    assert not any(FORGOTTEN in d for d in stored.values()), stored
    assert KEPT in stored.get(kept_id, ""), stored
