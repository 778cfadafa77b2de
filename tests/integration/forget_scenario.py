"""The forget-me acceptance scenario (issue 11), shared by the runtime-level tests
(test_forget_core.py) and the per-platform ones (test_forget_acceptance.py).

Why one module: every platform must show the same thing (the member's words and id are
nowhere on disk or in a later prompt, the opinions equal those of a community that never
heard them, the others' data is as it was), so the conversation, the scans and the
comparison live here once and each platform only supplies how a member speaks.

The conversation: a member argues FOR remote work, quoting a unique token in every
message (and the model's summary of each quotes it too, so the redaction of summaries is
exercised); a second member argues AGAINST; a third only CHATs. Each argument carries a
marker the loopback model's ESS rules match, so both communities (the one that forgets
and the fresh one that only ever hears the other two) get the same ESS results.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from bot.messages import Community, IncomingMessage, Reply, User
from bot.runtime import Runtime
from sonality.agent import SonalityAgent
from sonality.state import SpongeState
from storage import Database
from storage.export import MemberRows
from tests.fakes.anthropic_server import AnthropicFake, Brain, Delay
from tests.integration.conftest import command, eventually

#: The forgotten member's unique word: in their messages and in the summaries of them.
TOKEN = "zebraquokka42"

Role = Literal["for", "against", "chat"]
FOR: Role = "for"
AGAINST: Role = "against"
CHAT: Role = "chat"

TOPICS = ("remote_work", "office_culture")


@dataclass(frozen=True)
class Line:
    role: Role
    text: str


def conversation(rounds: int = 4) -> list[Line]:
    """Rounds of: the FOR argument, the AGAINST argument, a chat line (the cooling period
    of 3 commits updates within it, so provenance and netting both matter)."""
    lines: list[Line] = []
    for n in range(rounds):
        lines.append(
            Line(FOR, f"Point {n}: the {TOKEN} trial shows remote work raises output (arg{n}for).")
        )
        lines.append(
            Line(AGAINST, f"Point {n}: a panel study finds remote work lowers output (arg{n}vs).")
        )
        lines.append(Line(CHAT, f"Lovely weather today, chat line {n}."))
    return lines


def teach(brain: Brain, rounds: int = 4) -> None:
    """ESS results for every argument (chat lines get the fake's small-talk default)."""
    for n in range(rounds):
        topics = TOPICS[: 1 + n % 2]
        brain.ess_rule(
            contains=f"(arg{n}for)",
            score=0.55 + 0.1 * n,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
            novelty=0.9 - 0.2 * n,
            topics=topics,
            direction="supports",
            summary=f"The sender cites the {TOKEN} trial in favour of remote work.",
        )
        brain.ess_rule(
            contains=f"(arg{n}vs)",
            score=0.5 + 0.08 * n,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
            novelty=0.8 - 0.15 * n,
            topics=topics,
            direction="opposes",
            summary="The sender cites a panel study against remote work.",
        )


@pytest.fixture
def no_automatic_reflection(monkeypatch: pytest.MonkeyPatch) -> None:
    """No reflection triggered by count or accumulated shift: decay would otherwise
    happen at different points in the two communities (their counts differ). Set as an
    operator would, so the settings the test builds afterwards hand it to every agent
    (the half-interval guard then also holds back a shift-triggered one)."""
    monkeypatch.setenv("SONALITY_REFLECTION_EVERY", "100000")


# ------------------------------------------------------------------------------ scans


def file_bytes(path: Path | None) -> bytes:
    """A SQLite file with its write-ahead log and rollback journal, as on disk."""
    assert path is not None, "this scan reads the SQLite file (the default storage)"
    data = path.read_bytes()
    for suffix in ("-wal", "-journal"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            data += extra.read_bytes()
    return data


def files_holding(paths: Iterable[Path], needles: Sequence[str]) -> list[str]:
    """`path: needle` for every file (directories walked) whose bytes hold a needle.

    hnswlib's index files too: they once held heap garbage quoting a memory's summary,
    which the bot's glibc settings now prevent (sonality/memory/freed_memory.py)."""
    found: list[str] = []
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            data = path.read_bytes()
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def sqlite_files(database: Path) -> list[Path]:
    return [
        p
        for p in (database, *(database.with_name(database.name + s) for s in ("-wal", "-journal")))
        if p.exists()
    ]


def requests_holding(requests: Sequence[Any], needles: Sequence[str]) -> list[str]:
    """`#index: needle` for every recorded LLM request whose body holds a needle (the
    body as JSON, both with and without escaped non-ASCII)."""
    found: list[str] = []
    for index, request in enumerate(requests):
        body = request.body
        text = json.dumps(body) + json.dumps(body, ensure_ascii=False)
        found += [f"#{index}: {n}" for n in needles if n in text]
    return found


# ------------------------------------------------------------------------ comparisons


def assert_same_opinions_rebased(mine: SpongeState, fresh: SpongeState) -> None:
    """Opinions and confidences equal within 1e-9 (interaction counts differ by the
    rebase, so gaps are compared relative to the count)."""
    assert set(mine.opinion_vectors) == set(fresh.opinion_vectors)
    offset = mine.interaction_count - fresh.interaction_count
    for topic, value in fresh.opinion_vectors.items():
        assert math.isclose(mine.opinion_vectors[topic], value, rel_tol=0, abs_tol=1e-9)
        a, b = mine.belief_meta[topic], fresh.belief_meta[topic]
        assert math.isclose(a.confidence, b.confidence, rel_tol=0, abs_tol=1e-9)
        assert (a.evidence_count, a.last_reinforced - offset) == (
            b.evidence_count,
            b.last_reinforced,
        )
    assert [
        (u.topic, round(u.signed_magnitude, 12), u.due_interaction - offset)
        for u in mine.staged_opinion_updates
    ] == [
        (u.topic, round(u.signed_magnitude, 12), u.due_interaction)
        for u in fresh.staged_opinion_updates
    ]


def differs_somewhere(a: SpongeState, b: SpongeState) -> bool:
    """Whether leaving the member out changed an opinion (so the equality can fail)."""
    return any(
        abs(a.opinion_vectors.get(t, 0.0) - b.opinion_vectors.get(t, 0.0)) > 1e-3
        for t in set(a.opinion_vectors) | set(b.opinion_vectors)
    )


@dataclass(frozen=True)
class MemberData:
    """What is kept of one member: their SQLite rows and their episodes in Chroma."""

    rows: MemberRows
    episodes: list[dict[str, Any]]


async def member_data(
    db: Database, agent: SonalityAgent, community_id: str, member_id: str
) -> MemberData:
    rows = await db.member_rows(community_id, member_id)
    await agent.flush_episodes()
    episodes = agent.episodes.stored(rows.interaction_ids)
    return MemberData(rows, sorted(episodes, key=lambda e: str(e.get("id"))))


async def play(say: Callable[[str, Role, str], Awaitable[None]], whole: str, fresh: str) -> None:
    """The conversation in `whole`, and in `fresh` without the FOR member's lines."""
    for line in conversation():
        await say(whole, line.role, line.text)
        if line.role != FOR:
            await say(fresh, line.role, line.text)


def assert_nothing_left(
    database: Path, chroma_dir: Path, requests: Sequence[Any], needles: Sequence[str]
) -> None:
    """None of `needles` in the SQLite file (and its WAL), in any file under Chroma's
    directory, or in any of `requests` (the LLM requests sent after the forget-me)."""
    on_disk = files_holding([*sqlite_files(database), chroma_dir], needles)
    assert on_disk == [], f"still on disk: {on_disk}"
    sent = requests_holding(requests, needles)
    assert sent == [], f"sent to the model after the forget-me: {sent}"


async def reply_in_flight(
    runtime: Runtime, server: AnthropicFake, community: Community, user: User, text: str
) -> asyncio.Task[Reply | None]:
    """`user` says `text` and the model takes 1.5 s to answer; returns (the reply still
    to come) once the request for that answer has reached the fake."""
    server.enqueue(Delay(1.5))
    message = IncomingMessage(community=community, channel_id="c1", user=user, text=text)
    task = asyncio.create_task(runtime.handle(message))
    assert await eventually(lambda: server.in_flight > 0, 10)
    return task


#: A summary word only the rule below writes: whether a prompt holds it says whether
#: the memory reached the model.
GLIMMER = "glimmerfox"


def rate_glimmer(server: AnthropicFake) -> None:
    """A message with "(glimmer)" is strong evidence whose summary names GLIMMER."""
    server.brain.ess_rule(
        contains="(glimmer)",
        score=0.8,
        direction="supports",
        topics=["rent_control"],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary=f"The sender cites the {GLIMMER} housing survey.",
    )


def reflect_at_the_delete(
    runtime: Runtime,
    agent: SonalityAgent,
    monkeypatch: pytest.MonkeyPatch,
    community: Community,
    moderator: User,
) -> list[asyncio.Task[Any]]:
    """A moderator's `reflect` arrives as the agent's next memory delete begins (a
    forget-me's or a deletion's, after its replay), with time enough to run were the
    agent let go; the task (one, once the delete came) is in the list returned."""
    delete = agent.memory.forget
    reflecting: list[asyncio.Task[Any]] = []

    async def reflect_first(ids: Any) -> None:
        if not reflecting:
            asked = command(runtime, "reflect", community=community, user=moderator)
            reflecting.append(asyncio.create_task(asked))
            await asyncio.sleep(0.3)
        await delete(ids)

    monkeypatch.setattr(agent.memory, "forget", reflect_first)
    return reflecting
