"""The deleted-message scenario (issue 25, item 4), shared by the runtime-level tests
(test_message_deletion.py) and the per-platform ones (test_deletion_discord.py,
test_deletion_slack.py).

Three members talk; the first message is an argument with a unique word (in its text,
in the model's summary of it, in the insight drawn from it and in a topic only it
produces), strong enough to stage a move that commits after the cooling period. The
same conversation without that message is played in a second community that never
sees it. Once the argument is deleted, the first community's opinions must equal the
second's within 1e-9, and the word, the message's platform id and its interaction id
must be in no table of the database and no memory in Chroma.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from storage import Database
from tests.fakes.anthropic_server import Brain

#: The deleted argument's unique word.
WORD = "quokkadelta58"
#: The topic only the deleted argument produces (its label is its word too).
OWN_TOPIC = f"{WORD}_method"

Role = Literal["arguer", "critic", "chatter"]
ARGUER: Role = "arguer"
CRITIC: Role = "critic"
CHATTER: Role = "chatter"

DELETED = f"The {WORD} audit of forty firms found remote work raised output (delfor)."
#: What the deleted argument is edited into, in the edit tests.
EDITED = "On reflection, the forty-firm audit showed no effect at all (edfor)."


@dataclass(frozen=True)
class Line:
    role: Role
    text: str


CONVERSATION: tuple[Line, ...] = (
    Line(ARGUER, DELETED),
    Line(CRITIC, "A panel study finds remote work lowers output (argvs0)."),
    Line(CHATTER, "Lovely weather today, isn't it?"),
    Line(ARGUER, "Commute time saved goes into focused work, a trial shows (argfor1)."),
    Line(CRITIC, "Office culture suffers without shared rooms, a survey says (argvs1)."),
    Line(CHATTER, "Any plans for the weekend?"),
    Line(CRITIC, "Mentoring of juniors drops when remote, per a cohort study (argvs2)."),
)


def teach(brain: Brain) -> None:
    """ESS results for every argument (chat lines get the fake's small-talk default)."""
    brain.ess_rule(
        contains="(delfor)",
        score=0.82,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        novelty=0.9,
        topics=["remote_work", OWN_TOPIC],
        direction="supports",
        summary=f"The sender cites the {WORD} audit in favour of remote work.",
    )
    brain.ess_rule(
        contains="(edfor)",
        score=0.6,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        novelty=0.7,
        topics=["remote_work"],
        direction="opposes",
        summary="The sender now says the audit showed no effect on output.",
    )
    for n, (topics, direction, score) in enumerate(
        (
            (["remote_work"], "opposes", 0.55),
            (["remote_work", "office_culture"], "opposes", 0.6),
            (["office_culture"], "opposes", 0.58),
        )
    ):
        brain.ess_rule(
            contains=f"(argvs{n})",
            score=score,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
            novelty=0.8 - 0.1 * n,
            topics=topics,
            direction=direction,
            summary="The sender cites a study against remote work.",
        )
    brain.ess_rule(
        contains="(argfor1)",
        score=0.62,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        novelty=0.75,
        topics=["remote_work", "office_culture"],
        direction="supports",
        summary="The sender cites a trial on commute time saved.",
    )


Handle = TypeVar("Handle")


@dataclass(frozen=True)
class Played(Generic[Handle]):
    """What `play` says in the first community: the deleted argument's handle."""

    deleted: Handle


async def play(
    say: Callable[[str, Role, str], Awaitable[Handle]], whole: str, fresh: str
) -> Played[Handle]:
    """The conversation in `whole`, and in `fresh` without the argument to delete."""
    handles = []
    for line in CONVERSATION:
        handles.append(await say(whole, line.role, line.text))
        if line.text != DELETED:
            await say(fresh, line.role, line.text)
    return Played(handles[0])


async def tables_holding(db: Database, needles: Sequence[str]) -> list[str]:
    """`table: needle` for every table of the bot's database (either engine) with a row
    holding a needle in any column."""
    if db.dialect.postgres:
        listing = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    else:
        listing = "SELECT name FROM sqlite_master WHERE type = 'table'"
    found: list[str] = []
    for (table,) in await db._fetchall(listing):
        rows = await db._fetchall(f'SELECT * FROM "{table}"')
        text = "\n".join(_text(value) for row in rows for value in row)
        found += [
            f"{table}: {n}: {[v for row in rows for v in row if n in _text(v)][:3]}"
            for n in needles
            if n in text
        ]
    return found


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


async def interaction_of(db: Database, ref: str) -> str:
    """The interaction id of the one answer kept to the message `ref`."""
    [(interaction_id,)] = await db._fetchall(
        "SELECT id FROM interactions WHERE message_ref = ?", (ref,)
    )
    return str(interaction_id)


async def deletion_rows(db: Database) -> int:
    """How many deletions (and edits) the journal holds, tombstones included."""
    [(count,)] = await db._fetchall("SELECT COUNT(*) FROM message_deletions")
    return int(count)


def taken_back(db: Database, ref: str) -> Callable[[], Awaitable[bool]]:
    """Whether nothing of the message `ref` is kept and no deletion is unfinished."""

    async def check() -> bool:
        return not await db.communities_holding(ref) and not await db.open_deletions()

    return check


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 10.0) -> None:
    """Poll `check`: work a platform event started in the background."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
