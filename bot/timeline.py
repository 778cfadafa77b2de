"""`/sonality timeline [topic] [days]`: how the personality's opinions moved, as a picture.

Why a picture: a moderator asking "how did it come to think this, and who talked it
into it?" would otherwise read pages of `history`. The timeline shows, per belief, the
stance over the interactions, how settled it was, every committed move coloured by the
member whose argument caused it, and where reflections, rollbacks and forget-me
requests happened.

What is drawn comes from the stored history and nothing else, in two steps:

1. `build_timeline` reads the versions (newest first, at most `MAX_VERSIONS`, or those
   of the last `days`), the stored rows of the whole range in one read, the audit
   trail and the members' names; `compute_timeline` replays the rows once, reading the
   beliefs of every version where one could have changed, into a `Timeline` (pydantic,
   so tests check the data behind the picture rather than pixels).
2. `render_png` draws it with matplotlib's object API on the Agg canvas (no display,
   no pyplot state), imported only when a picture is made.

Why the replay and the drawing run in a worker process (`Timelines`, `bot.offload`):
3,000 versions of a community holding 200 beliefs are seconds of CPU, and any member
may ask. On the event loop that stalled every community's replies; in a thread it
still held the GIL the loop needs. Answers are kept per community version, and the
command shares the member flood limit with messages (`bot.runtime`).

Credit for a move. Commits record no per-member provenance yet, so it is rebuilt from
the audit trail: an "ess" event lists what its speaker staged (topic, signed delta,
interaction it is due), and the topic's commit at that interaction is the move. The
walk keeps the set of updates still cooling, re-reads it from every stored state it
loads (so anything it cannot follow, such as a forget-me recomputation, resets it),
and follows a rollback, which restores the target's cooling updates shifted by the
rollback's interaction offset. When several members' updates were netted into one
commit, the dot takes the colour of the member whose update had the largest |delta|;
the others are kept in `CommittedMove.contributors`. A move whose argument is no
longer in the audit trail is drawn grey, as "not recorded".

Names are the ones stored with the member's messages (`member_names`), so a member
forgotten under a pseudonym shows only as that pseudonym, and a member with no name
known any more (their messages were deleted) is never shown by their platform id: the
legend groups them with the members past `MAX_MEMBERS`. Nothing drawn is read as
matplotlib mathtext (`STYLE`), so a name such as "Tom$$" is drawn as typed.
"""

from __future__ import annotations

import asyncio
import io
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from bot.command_table import BY_NAME, TIMELINE_MAX_DAYS
from bot.messages import TIMELINE_FILE_PREFIX, Attachment, CommandRequest, CommandResult
from bot.offload import Worker
from sonality import config
from sonality.ess import normalize_topic
from sonality.opinions import resisted
from sonality.store import VersionInfo
from storage.base import Conn
from storage.history import (
    HistoryReader,
    VersionRange,
    VersionSpan,
    read_events,
    read_spans,
    read_versions,
)
from storage.people import StagedArgument, StagedRow, parse_staged_arguments, staged_rows

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.typing import LineStyleType, RcKeyType

    from storage import Database

#: Versions read at most (newest first); an older start is marked as cut in the title.
MAX_VERSIONS = 3000
#: Beliefs shown as small multiples when no topic is asked for.
MAX_PANELS = 6
MAX_DAYS = TIMELINE_MAX_DAYS
#: Members with a colour and a marker of their own; more are drawn as "others".
MAX_MEMBERS = 7
WIDTH_PX = 1000
HEIGHT_PX = 600
DPI = 100

MarkerKind = Literal["reflection", "rollback", "forget-me"]
#: Version causes that can change a belief without the change line saying so.
_QUIET_CAUSES = frozenset({"interaction"})
#: Words of an interaction's change line when it committed, decayed or reflected.
_CHANGE_WORDS = ("committed", "reflection", "decayed")


class TimelineError(Exception):
    """No picture: `text` says why (`ok` False for a wrong argument, True for "nothing
    to draw yet", which is an answer, not a mistake)."""

    def __init__(self, text: str, *, ok: bool) -> None:
        super().__init__(text)
        self.text = text
        self.ok = ok

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in the worker process: pickled by hand, as `ok` is keyword-only.
        return (_timeline_error, (self.text, self.ok))


def _timeline_error(text: str, ok: bool) -> TimelineError:
    return TimelineError(text, ok=ok)


class BeliefPoint(BaseModel):
    """A belief's value from this version on, until the next point (a step function)."""

    model_config = ConfigDict(frozen=True)

    version: int
    interaction: int
    stance: float | None  # None: no belief held on the topic at this version
    confidence: float = 0.0


class CommittedMove(BaseModel):
    """A topic's staged updates committed at one version, credited to a member."""

    model_config = ConfigDict(frozen=True)

    version: int
    interaction: int
    topic: str
    stance: float | None  # after the commit
    member_id: str | None  # largest |delta| among the netted updates; None: not recorded
    updates: int  # staged updates netted into this commit
    contributors: tuple[str, ...] = ()  # every credited member, largest |delta| first


class Marker(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: MarkerKind
    version: int
    interaction: int
    label: str


class BeliefSeries(BaseModel):
    model_config = ConfigDict(frozen=True)

    topic: str
    points: tuple[BeliefPoint, ...]
    moves: tuple[CommittedMove, ...] = ()

    def at(self, version: int) -> BeliefPoint | None:
        """The point in force at `version` (None before the first point)."""
        found = None
        for point in self.points:
            if point.version > version:
                break
            found = point
        return found


class Member(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str  # as stored with their messages (`member_names`), else UNNAMED_MEMBER
    moves: int
    named: bool = True  # False: no name known, drawn among the grouped "other members"


class Timeline(BaseModel):
    """Everything the picture shows, for the picture and for tests."""

    model_config = ConfigDict(frozen=True)

    community: str
    topic: str | None = None
    days: int | None = None
    first_version: int
    last_version: int
    first_interaction: int
    last_interaction: int
    truncated: bool = False  # older versions exist that were not read
    series: tuple[BeliefSeries, ...]
    markers: tuple[Marker, ...] = ()
    members: tuple[Member, ...] = ()

    @property
    def file_name(self) -> str:
        topic = f"-{self.topic}" if self.topic else ""
        return f"{TIMELINE_FILE_PREFIX}{self.last_version}{topic}.png"


def reach(stance: float, confidence: float) -> tuple[float, float]:
    """The band around a stance: (low, high) = how far ONE argument could move it now.

    The engine's largest single step is OPINION_BASE_RATE (an ESS of 1.0 at full
    novelty, after the first interactions), resisted as `sonality.opinions.resisted`
    does. So the band narrows as confidence grows, and is narrower on the side of zero.
    """
    step = resisted(config.OPINION_BASE_RATE, confidence)
    against = resisted(config.OPINION_BASE_RATE, confidence, abs(stance))
    if stance > 0:
        return stance - against, stance + step
    if stance < 0:
        return stance - step, stance + against
    return -step, step


# ---------------------------------------------------------------------- the command

#: Answers kept per runtime (a picture is about 100 KB).
CACHE_SIZE = 16

Offload = Callable[[Callable[[Any], Any], Any], Awaitable[Any]]
"""Runs `fn(arg)` somewhere else and returns its result: a `Worker` process's `call`,
or `in_thread` for callers without one (tests, scripts)."""

#: What the worker imports as it starts: this module, and what `render_png` draws with.
WORKER_PRELOAD = ("bot.timeline", "matplotlib.backends.backend_agg", "matplotlib.figure")

_CacheKey = tuple[str, str, str | None, int | None, int, int, bool, tuple[Any, ...]]


async def in_thread(fn: Callable[[Any], Any], arg: Any) -> Any:
    return await asyncio.to_thread(fn, arg)


class Timelines:
    """`/sonality timeline` for one runtime: the history read in one pass, the replay
    and the picture made in the worker process (`bot.offload`), answers kept.

    An answer is kept by community, its name, topic, days and the versions it covers
    (first, last, cut or not). Anything that changes what is drawn (a message, a
    rollback, a forget-me) commits a version and so makes a new key. A forget-me's or a
    message deletion's erase comes after its version and adds none, so the key also
    holds the community's finished erasures (`erasures_finished`), read before the
    answer's data: one read mid-erase is never served once the erase finished, in any
    process on the database. Identical requests that arrive while one is being made
    wait for it rather than make it again. Names are read when an answer is made: a
    member who renames shows under the old name until the next version.
    """

    def __init__(
        self, db: Database, worker: Worker | None = None, cache_size: int = CACHE_SIZE
    ) -> None:
        self._db = db
        self.worker = worker or Worker(preload=WORKER_PRELOAD)
        self._cache_size = cache_size
        self._cache: OrderedDict[_CacheKey, CommandResult] = OrderedDict()
        self._making: dict[_CacheKey, asyncio.Task[CommandResult]] = {}
        # One answer made at a time: the worker replays one anyway, and reading ten
        # histories at once only piles their parsing onto the event loop.
        self._turn = asyncio.Lock()

    async def run(self, request: CommandRequest, *, now: datetime | None = None) -> CommandResult:
        """The whole command; errors as short answers."""
        cid = request.community.id
        try:
            topic, days = parse_args(request.args)
            name = request.community.name or await _stored_name(self._db, cid)
            # Before the data: an answer read mid-erase is kept under the old marker.
            erased = await self._db.community(cid).erasures_finished()
            span = await read_range(self._db, cid, days, now)
        except TimelineError as exc:
            return _answer_error(exc)
        key = (cid, name, topic, days, span.first, span.last, span.truncated, erased)
        kept = self._cache.get(key)
        if kept is not None:
            self._cache.move_to_end(key)
            return kept
        task = self._making.get(key)
        if task is None:
            job = self._make(TimelineJob(self._db.history_reader(), cid, name, topic, days, span))
            task = asyncio.create_task(job, name=f"timeline:{cid}")
            self._making[key] = task
            task.add_done_callback(lambda done: self._made(key, done))
        # Shielded: a caller who gives up does not cancel it for the others waiting.
        return await asyncio.shield(task)

    async def _make(self, job: TimelineJob) -> CommandResult:
        async with self._turn:
            try:
                timeline = await _build(self._db, job, self.worker.call)
            except TimelineError as exc:
                return _answer_error(exc)
            png = await self.worker.call(render_png, timeline)
        return CommandResult(
            text=caption(timeline),
            title="Timeline",
            files=(
                Attachment(
                    name=timeline.file_name,
                    data=png,
                    mime_type="image/png",
                    description=alt_text(timeline),
                ),
            ),
        )

    def _made(self, key: _CacheKey, task: asyncio.Task[CommandResult]) -> None:
        self._making.pop(key, None)
        if task.cancelled() or task.exception() is not None:  # retrieved: its waiters raise it
            return
        self._cache[key] = task.result()
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def close(self) -> None:
        for task in list(self._making.values()):
            task.cancel()
        await self.worker.close()


def _answer_error(exc: TimelineError) -> CommandResult:
    return CommandResult(
        text=exc.text, ok=exc.ok, private=not exc.ok, title="" if not exc.ok else "Timeline"
    )


#: How much of a bad argument an answer repeats (as `bot.commands` does).
MAX_SHOWN_ARG = 24
_USAGE = f"Usage: `/sonality {BY_NAME['timeline'].usage()}`."
#: Signs a typed number may start with (a dash, a plus, the Unicode minus).
_SIGNS = "+-\u2212"


def parse_args(args: Sequence[str]) -> tuple[str | None, int | None]:
    """`[topic words...] [days]`: a trailing number is the days, the rest the topic (so
    a topic may be several words, as on Slack; a topic that is only a number cannot be
    asked for, which no engine topic is).

    A trailing word of digits, with or without signs, is always meant as the days, so
    anything of that shape that is not a whole number from 1 to `MAX_DAYS` is answered
    with the usage: "²", "--5", "-3", or a number too long for `int` to read. Decimal
    digits of any script count, as `int` reads them ("٣" is 3), as the other commands'
    numbers do (`bot.commands._int_arg`)."""
    words = [w for a in args for w in a.split()]
    days = None
    if words and _looks_numeric(words[-1]):
        raw = words.pop()
        try:
            days = int(raw)
        except ValueError:  # "²", "--5", "−5", or more than 4,300 digits
            days = None
        if days is None or not 1 <= days <= MAX_DAYS:
            raise TimelineError(
                f"`{_shown_arg(raw)}` is not a number of days: use a whole number from 1 to "
                f"{MAX_DAYS}. {_USAGE}",
                ok=False,
            )
    topic = normalize_topic(" ".join(words)) or None
    return topic, days


def _looks_numeric(word: str) -> bool:
    digits = word.lstrip(_SIGNS)
    return bool(digits) and all(c.isdigit() for c in digits)


def _shown_arg(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_ARG else text[: MAX_SHOWN_ARG - 1] + "…"


async def _stored_name(db: Database, community_id: str) -> str:
    info = await db.community_info(community_id)
    return info.name if info is not None else ""


def caption(timeline: Timeline) -> str:
    """The short text that goes with the picture."""
    beliefs = len(timeline.series)
    what = (
        f"how my view on {timeline.topic} moved"
        if timeline.topic
        else f"how my {beliefs} strongest belief{'s' if beliefs != 1 else ''} moved"
    )
    span = f"v{timeline.first_version}–v{timeline.last_version}"
    if timeline.days:
        span += f", last {timeline.days} day{'s' if timeline.days != 1 else ''}"
    return (
        f"Opinion timeline: {what} ({span}). Dots are committed moves, coloured by the "
        "member whose argument it was; the band is how far one argument could still move it."
    )


def alt_text(timeline: Timeline) -> str:
    """A screen reader's version of the picture: each belief's start and end."""
    parts = []
    for series in timeline.series:
        first, last = series.points[0], series.points[-1]
        parts.append(
            f"{series.topic} from {_fmt_stance(first.stance)} to {_fmt_stance(last.stance)}"
            f" ({len(series.moves)} committed move{'s' if len(series.moves) != 1 else ''})"
        )
    return ("Opinion timeline: " + "; ".join(parts) + ".")[:1000]


def _fmt_stance(value: float | None) -> str:
    return "none" if value is None else f"{value:+.2f}"


# ---------------------------------------------------------------------- the data


def _can_change_beliefs(version: VersionInfo) -> bool:
    """Whether beliefs may differ from the previous version's: anything that is not an
    interaction, or an interaction whose change line says it committed, decayed or
    reflected. Plain chat versions are never read, which keeps a long history cheap."""
    if version.cause not in _QUIET_CAUSES:
        return True
    return any(word in version.change for word in _CHANGE_WORDS)


async def read_range(
    db: Database, community_id: str, days: int | None, now: datetime | None = None
) -> VersionRange:
    """The versions to draw: the newest `MAX_VERSIONS`, or those of the last `days`;
    `TimelineError` when there are none."""
    since = (now or datetime.now(UTC)) - timedelta(days=days) if days else None
    found = await db.community(community_id).version_range(since, MAX_VERSIONS)
    if found is not None:
        return found
    if days:
        raise TimelineError(
            f"Nothing changed in the last {days} day{'s' if days != 1 else ''}; try more days.",
            ok=True,
        )
    raise TimelineError(_NO_BELIEFS, ok=True)


async def build_timeline(
    db: Database,
    community_id: str,
    community_name: str = "",
    *,
    topic: str | None = None,
    days: int | None = None,
    now: datetime | None = None,
    offload: Offload = in_thread,
) -> Timeline:
    """Read the history into a `Timeline`; `TimelineError` when there is nothing to draw
    or the topic is unknown. The reading and the replay run through `offload`."""
    span = await read_range(db, community_id, days, now)
    job = TimelineJob(db.history_reader(), community_id, community_name, topic, days, span)
    return await _build(db, job, offload)


@dataclass(frozen=True)
class TimelineJob:
    """What the worker needs to read and replay one timeline: a few numbers and how
    to open the database (`HistoryReader`), so that sending it costs the bot's process
    nothing and the rows never pass through it."""

    reader: HistoryReader
    community_id: str
    name: str  # the community's, for the title
    topic: str | None
    days: int | None
    span: VersionRange


async def _build(db: Database, job: TimelineJob, offload: Offload) -> Timeline:
    """The replay through `offload`, then the members' names."""
    timeline: Timeline = await offload(compute_timeline, job)
    members = await _members(db, job.community_id, timeline.series)
    return timeline.model_copy(update={"members": members})


@dataclass(frozen=True)
class _History:
    """What `compute_timeline` reads, in one snapshot."""

    versions: list[VersionInfo]  # oldest first
    wanted: set[int]  # versions whose beliefs are read
    spans: list[VersionSpan]  # the rows to rebuild them
    rollbacks: dict[int, int]  # rollback version -> its target
    reflections: dict[int, dict[str, Any]]
    arguments: list[StagedRow]

    def states(self) -> dict[int, _Beliefs]:
        """The beliefs of every wanted version, the spans replayed once, in order."""
        states: dict[int, _Beliefs] = {}
        for span in self.spans:
            for number, state in span.replay():
                if number in self.wanted:
                    states[number] = _beliefs_of(state)
        return states


def _read_history(conn: Conn, job: TimelineJob) -> _History:
    """Everything the timeline draws from, in one pass: the versions, the rows to
    rebuild the range in order (a rollback's target before the range is read from its
    own keyframe, not by stretching the range back to it), and the audit trail. Only
    reading: the replay waits until the connection is closed, so the snapshot is held
    no longer than the reads take (a forget-me's VACUUM waits for it)."""
    cid, first, last = job.community_id, job.span.first, job.span.last
    versions = read_versions(conn, cid, first, last)
    rollbacks = {
        e.version: int(e.payload.get("to_version", -1))
        for e in read_events(conn, cid, "rollback", first, last)
    }
    reflections = {e.version: e.payload for e in read_events(conn, cid, "reflection", first, last)}
    wanted = {first, last, *(v.version for v in versions if _can_change_beliefs(v))}
    wanted |= {t for t in rollbacks.values() if t >= 0}
    ranges = [(first, last), *((t, t) for t in sorted(t for t in wanted if t < first))]
    spans = read_spans(conn, cid, ranges)
    return _History(versions, wanted, spans, rollbacks, reflections, staged_rows(conn, cid, last))


_NO_BELIEFS = "I hold no beliefs yet: nobody has given me a strong enough argument."

_Key = tuple[str, int, int]  # (topic, staged at interaction, due at interaction)


@dataclass(frozen=True, slots=True)
class _Beliefs:
    """What the timeline reads of one version's stored state, taken from its JSON
    without building a `SpongeState` (1,500 of those were most of a long timeline's
    time). The field names and defaults are the state's own."""

    opinions: dict[str, float]
    confidence: dict[str, float]
    staged: list[_Key]  # the updates still cooling, in order
    # Topics committed at this version -> the members of that move, largest first.
    moved_by: dict[str, list[str]]


def _beliefs_of(state: dict[str, Any]) -> _Beliefs:
    count = state.get("interaction_count", 0)
    confidence: dict[str, float] = {}
    moved_by: dict[str, list[str]] = {}
    for topic, meta in (state.get("belief_meta") or {}).items():
        confidence[topic] = meta.get("confidence", 0.0)
        # A commit reinforces its topic at the commit's interaction: only then are its
        # sources this version's move (the fallback credit of `_moves`).
        if meta.get("last_reinforced") == count and meta.get("moved_by"):
            moved_by[topic] = [str(s.get("member", "")) for s in meta["moved_by"]]
    return _Beliefs(
        opinions=dict(state.get("opinion_vectors") or {}),
        confidence=confidence,
        staged=[
            (str(u["topic"]), int(u["staged_at"]), int(u["due_interaction"]))
            for u in state.get("staged_opinion_updates") or ()
        ],
        moved_by=moved_by,
    )


def compute_timeline(job: TimelineJob) -> Timeline:
    """The replay and everything drawn from it, without member names (`_build` adds
    them). Runs in the worker process, which reads the history itself."""
    history = job.reader.read(lambda conn: _read_history(conn, job))
    states = history.states()
    versions = history.versions
    if not versions:  # removed meanwhile (history only grows otherwise)
        raise TimelineError(_NO_BELIEFS, ok=True)
    first, last = versions[0], versions[-1]
    in_range = [v for v in versions if v.version in states]
    peaks: dict[str, float] = {}
    for version in in_range:
        for topic, stance in states[version.version].opinions.items():
            if abs(stance) >= peaks.get(topic, 0.0):
                peaks[topic] = abs(stance)
    if not peaks:
        raise TimelineError(_NO_BELIEFS, ok=True)
    topics = _choose(peaks, states[last.version].opinions, job.topic)
    moves = _moves(versions, states, history.rollbacks, parse_staged_arguments(history.arguments))
    series = tuple(
        BeliefSeries(
            topic=topic,
            points=_points(in_range, states, topic),
            moves=tuple(m for m in moves if m.topic == topic),
        )
        for topic in topics
    )
    return Timeline(
        community=job.name or "this community",
        topic=job.topic and series[0].topic,
        days=job.days,
        first_version=first.version,
        last_version=last.version,
        first_interaction=first.interaction_count,
        last_interaction=last.interaction_count,
        truncated=job.span.truncated,
        series=series,
        markers=_markers(versions, history.rollbacks, history.reflections),
    )


def _points(
    in_range: list[VersionInfo], states: dict[int, _Beliefs], topic: str
) -> tuple[BeliefPoint, ...]:
    """One belief as a step function over the read versions: a point where it changed."""
    points: list[BeliefPoint] = []
    last: tuple[float | None, float] | None = None
    for version in in_range:
        state = states[version.version]
        stance = state.opinions.get(topic)
        confidence = state.confidence.get(topic, 0.0) if stance is not None else 0.0
        if (stance, confidence) == last:
            continue
        last = (stance, confidence)
        points.append(
            BeliefPoint(
                version=version.version,
                interaction=version.interaction_count,
                stance=stance,
                confidence=confidence,
            )
        )
    return tuple(points)


def _choose(peaks: dict[str, float], now: dict[str, float], topic: str | None) -> list[str]:
    """The asked-for belief, or the strongest ones: held now by |stance|, then those no
    longer held by the largest |stance| they reached (`peaks`: every topic held in the
    range)."""
    if topic is not None:
        if topic in peaks:
            return [topic]
        close = sorted(t for t in peaks if topic in t)
        if len(close) == 1:
            return close
        if close:
            raise TimelineError(
                f"`{topic}` matches several beliefs: {', '.join(close[:6])}. Pick one.", ok=False
            )
        raise TimelineError(f"I have no belief about `{topic}`.", ok=False)

    def strength(t: str) -> tuple[int, float, str]:
        if t in now:
            return (0, -abs(now[t]), t)
        return (1, -peaks[t], t)

    return sorted(peaks, key=strength)[:MAX_PANELS]


def _moves(
    versions: list[VersionInfo],
    states: dict[int, _Beliefs],
    rollbacks: dict[int, int],
    arguments: Iterable[StagedArgument],
) -> list[CommittedMove]:
    """Replay the cooling queue over the range to credit each commit (module docstring)."""
    credit: dict[_Key, list[tuple[str, float]]] = {}
    staged_at: dict[int, list[StagedArgument]] = {}
    for argument in arguments:
        staged_at.setdefault(argument.version, []).append(argument)
        for entry in argument.staged:
            key = (entry.topic, argument.interaction, entry.due)
            credit.setdefault(key, []).append((argument.speaker, entry.delta))

    pending: list[_Key] = list(states[versions[0].version].staged)
    moves: list[CommittedMove] = []
    for version in versions[1:]:
        count = version.interaction_count
        if version.cause == "interaction":
            due = [k for k in pending if k[2] <= count]
            pending = [k for k in pending if k[2] > count]
            state = states.get(version.version)
            for topic in dict.fromkeys(k[0] for k in due):
                shares = [c for k in due if k[0] == topic for c in credit.get(k, [])]
                shares.sort(key=lambda c: -abs(c[1]))
                if not shares and state is not None:
                    # No audit row credits it (a forget-me deleted them): the committed
                    # state's own sources, where a forgotten member is a pseudonym.
                    shares = [(member, 0.0) for member in state.moved_by.get(topic, [])]
                moves.append(
                    CommittedMove(
                        version=version.version,
                        interaction=count,
                        topic=topic,
                        stance=state.opinions.get(topic) if state is not None else None,
                        member_id=shares[0][0] if shares else None,
                        updates=sum(1 for k in due if k[0] == topic),
                        contributors=tuple(dict.fromkeys(c[0] for c in shares)),
                    )
                )
            for argument in staged_at.get(version.version, []):
                pending += [(e.topic, argument.interaction, e.due) for e in argument.staged]
        state = states.get(version.version)
        if state is None:
            continue
        target = states.get(rollbacks.get(version.version, -1))
        if target is not None:
            # The restored cooling updates are the target's, in order, shifted by the
            # rollback's interaction offset: they keep their speakers.
            for old, new in zip(target.staged, state.staged, strict=False):
                if old in credit and new not in credit:
                    credit[new] = credit[old]
        pending = list(state.staged)
    return moves


def _markers(
    versions: list[VersionInfo], rollbacks: dict[int, int], reflections: dict[int, dict[str, Any]]
) -> tuple[Marker, ...]:
    out = []
    for version in versions:
        at = {"version": version.version, "interaction": version.interaction_count}
        if version.cause == "rollback":
            target = rollbacks.get(version.version, -1)
            label = f"rollback to v{target}" if target >= 0 else "rollback"
            out.append(Marker(kind="rollback", label=label, **at))
        elif version.cause == "forget-me":
            out.append(Marker(kind="forget-me", label="forget-me", **at))
        reflection = reflections.get(version.version)
        if reflection is not None and reflection.get("ran", True):
            label = "reflection" if reflection.get("accepted", True) else "reflection (rejected)"
            out.append(Marker(kind="reflection", label=label, **at))
        elif reflection is None and version.cause == "reflection":
            out.append(Marker(kind="reflection", label="reflection", **at))
    return tuple(out)


async def _members(
    db: Database, community_id: str, series: Iterable[BeliefSeries]
) -> tuple[Member, ...]:
    counts: dict[str, int] = {}
    for s in series:
        for move in s.moves:
            if move.member_id is not None:
                counts[move.member_id] = counts.get(move.member_id, 0) + 1
    names = await member_names(db, community_id, counts)
    members = [
        Member(id=i, name=names.get(i) or UNNAMED_MEMBER, moves=n, named=i in names)
        for i, n in counts.items()
    ]
    # Named members first: they get the colours; the unnamed are grouped (`_legend_entries`).
    members.sort(key=lambda m: (not m.named, -m.moves, m.name.casefold(), m.id))
    return tuple(members)


#: How a credited member is shown when no name is known for them any more (their
#: messages were deleted): never by their platform id.
UNNAMED_MEMBER = "a member"


async def member_names(
    db: Database, community_id: str, member_ids: Iterable[str]
) -> dict[str, str]:
    """How each credited member may be shown, for the timeline and for `history` and
    `beliefs` (`bot.commands.credit_text`): the latest name stored with their messages
    (`Database.speaker_names`), or, for a forgotten member, their pseudonym, which is
    shown as it is (the forget-me journal holds it; their messages are gone). A member
    left out has no known name, and is shown as UNNAMED_MEMBER, not by their id."""
    wanted = {m for m in member_ids if m}
    names = await db.speaker_names(community_id, wanted)
    missing = wanted - names.keys()
    if missing:
        names.update({p: p for p in missing & await db.journal_pseudonyms()})
    return names


# ---------------------------------------------------------------------- the picture

# Okabe-Ito: distinguishable with the common colour-vision deficiencies; yellow last,
# as it is the faintest on white. Each member also gets a marker shape of their own,
# so no dot depends on colour alone.
MEMBER_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442")
MEMBER_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
OTHERS_COLOUR = "#999999"
UNKNOWN_COLOUR = "#FFFFFF"
LINE_COLOUR = "#222222"
BAND_COLOUR = "#7F7F7F"
MARKER_STYLES: dict[MarkerKind, tuple[str, LineStyleType, float]] = {
    # kind: (colour, line style, width)
    "reflection": ("#555555", ":", 2.2),
    "rollback": ("#000000", "--", 2.2),
    "forget-me": ("#000000", "-.", 2.2),
}
STYLE: dict[RcKeyType, Any] = {
    # Members' and communities' names are drawn as typed: "Tom$$" or "$\\x$" read as
    # mathtext would fail the whole picture (or draw something else).
    "text.parse_math": False,
    "text.usetex": False,
    "font.size": 15,
    "axes.titlesize": 16,
    "axes.labelsize": 15,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "legend.fontsize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
}


def _grid(panels: int) -> tuple[int, int]:
    return {1: (1, 1), 2: (1, 2), 3: (1, 3), 4: (2, 2)}.get(panels, (2, 3))


#: Legend entries per row, and how much of a name is shown there.
LEGEND_COLUMNS = 5
LEGEND_NAME_CHARS = 16
CAPTION = (
    "Line: stance. Shaded: how far one argument could still move it (narrower = more confident)."
)


def render_png(timeline: Timeline) -> bytes:
    """The picture, WIDTH_PX × HEIGHT_PX; see the module docstring for what it shows.

    Laid out for a chat preview at about half size: large type, few ticks, one shared
    stance scale for every panel, and a bottom block (x label, legend, caption) whose
    height follows the legend's rows, measured in pixels so nothing overlaps.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    styles = _member_styles(timeline.members)
    handles, labels = _legend_entries(timeline, styles, Line2D)
    legend_rows = math.ceil(len(handles) / LEGEND_COLUMNS)
    # Pixels from the bottom: caption, legend (title + rows), x label, tick labels.
    legend_bottom = 30
    legend_top = legend_bottom + (28 * (legend_rows + 1) + 6 if handles else 0)
    xlabel_y = legend_top + 6
    axes_bottom = xlabel_y + 58
    with matplotlib.rc_context(STYLE):
        rows, cols = _grid(len(timeline.series))
        grid = figure.add_gridspec(
            rows,
            cols,
            left=0.1,
            right=0.985,
            top=0.8,
            bottom=axes_bottom / HEIGHT_PX,
            hspace=0.55,
            wspace=0.1,
        )
        low, high = _y_range(timeline.series)
        axes: list[Axes] = []
        for index, series in enumerate(timeline.series):
            share = axes[0] if axes else None
            ax = figure.add_subplot(grid[index // cols, index % cols], sharex=share, sharey=share)
            axes.append(ax)
            _panel(ax, series, timeline, styles, title_chars=44 // cols)
            ax.set_ylim(low, high)
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
            if index % cols:
                ax.tick_params(labelleft=False)
            if index + cols < len(timeline.series):  # a panel below shows the ticks
                ax.tick_params(labelbottom=False)
        first, last = timeline.first_interaction, timeline.last_interaction
        pad = max(1.0, (last - first) * 0.02)
        axes[0].set_xlim(first - pad, last + pad)
        figure.supxlabel(
            "interaction (messages learned from)", y=xlabel_y / HEIGHT_PX, va="bottom", fontsize=15
        )
        figure.supylabel("stance (− against, + for)", x=0.012, fontsize=15)
        figure.suptitle(_title(timeline), fontsize=19, fontweight="bold", y=0.985)
        if handles:
            figure.legend(
                handles,
                labels,
                loc="lower center",
                bbox_to_anchor=(0.5, legend_bottom / HEIGHT_PX),
                ncol=min(len(handles), LEGEND_COLUMNS),
                frameon=False,
                title=_legend_title(timeline),
                title_fontsize=13,
                handletextpad=0.4,
                columnspacing=1.0,
                borderaxespad=0,
                borderpad=0,
            )
        figure.text(0.5, 6 / HEIGHT_PX, CAPTION, ha="center", fontsize=12, color="#444444")
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=DPI)
    return out.getvalue()


def _legend_entries(
    timeline: Timeline, styles: dict[str, tuple[str, str]], line2d: Any
) -> tuple[list[Any], list[str]]:
    """Members (whose arguments the dots are), then the kinds of events marked."""
    handles: list[Any] = []
    labels: list[str] = []
    own = _own_style(timeline.members)
    for member in own:
        colour, marker = styles[member.id]
        handles.append(_dot(line2d, colour, marker))
        labels.append(_short(member.name, LEGEND_NAME_CHARS))
    rest = len(timeline.members) - len(own)
    if rest:
        handles.append(_dot(line2d, OTHERS_COLOUR, "h"))
        labels.append(_others_label(rest, after_names=bool(own)))
    if any(m.member_id is None for s in timeline.series for m in s.moves):
        handles.append(_dot(line2d, UNKNOWN_COLOUR, "o"))
        labels.append("not recorded")
    for kind in dict.fromkeys(m.kind for m in timeline.markers):
        colour, style, width = MARKER_STYLES[kind]
        handles.append(line2d([], [], color=colour, linestyle=style, linewidth=width))
        labels.append(kind)
    return handles, labels


def _legend_title(timeline: Timeline) -> str:
    dots = any(s.moves for s in timeline.series)
    lines = bool(timeline.markers)
    if dots and lines:
        return "dots: whose argument moved it   ·   lines: events"
    return "dots: whose argument moved it" if dots else "lines: events"


def _title(timeline: Timeline) -> str:
    span = f"v{timeline.first_version}–v{timeline.last_version}"
    if timeline.days:
        span += f", last {timeline.days} day{'s' if timeline.days != 1 else ''}"
    elif timeline.truncated:
        span += f" (the last {MAX_VERSIONS:,} versions)"
    return f"Opinion timeline of {_short(timeline.community, 38)}\n{span}"


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def _dot(line2d: Any, colour: str, marker: str) -> Any:
    return line2d(
        [],
        [],
        linestyle="",
        marker=marker,
        markersize=11,
        markerfacecolor=colour,
        markeredgecolor="#000000",
    )


def _own_style(members: Sequence[Member]) -> list[Member]:
    """The members with a colour and a legend entry of their own: the first
    `MAX_MEMBERS` named ones. The others (more, or with no name known) share one."""
    return [m for m in members if m.named][:MAX_MEMBERS]


def _others_label(count: int, *, after_names: bool) -> str:
    """The shared legend entry: "2 other members", or without named members before it
    "a member" / "3 members"."""
    if after_names:
        return f"{count} other member{'s' if count != 1 else ''}"
    return UNNAMED_MEMBER if count == 1 else f"{count} members"


def _member_styles(members: Sequence[Member]) -> dict[str, tuple[str, str]]:
    styles = {m.id: (OTHERS_COLOUR, "h") for m in members}
    for index, member in enumerate(_own_style(members)):
        styles[member.id] = (MEMBER_COLOURS[index], MEMBER_MARKERS[index])
    return styles


def _y_range(series: Sequence[BeliefSeries]) -> tuple[float, float]:
    """One stance range for every panel, so stances compare at a glance: the stances
    and their bands, always with zero in view, never narrower than one full step."""
    low, high = 0.0, 0.0
    for s in series:
        for point in s.points:
            if point.stance is not None:
                band_low, band_high = reach(point.stance, point.confidence)
                low, high = min(low, band_low), max(high, band_high)
    if high - low < 2 * config.OPINION_BASE_RATE:
        middle = (high + low) / 2
        low, high = middle - config.OPINION_BASE_RATE, middle + config.OPINION_BASE_RATE
    pad = (high - low) * 0.06
    return max(-1.0, low - pad), min(1.0, high + pad)


def _panel(
    ax: Axes,
    series: BeliefSeries,
    timeline: Timeline,
    styles: dict[str, tuple[str, str]],
    title_chars: int,
) -> None:
    xs = [p.interaction for p in series.points] + [timeline.last_interaction]
    stances = [math.nan if p.stance is None else p.stance for p in series.points]
    ys = [*stances, stances[-1]]
    bands = [
        reach(p.stance, p.confidence) if p.stance is not None else (math.nan, math.nan)
        for p in series.points
    ]
    lows = [b[0] for b in bands] + [bands[-1][0]]
    highs = [b[1] for b in bands] + [bands[-1][1]]
    ax.axhline(0, color="#999999", linewidth=1.2, zorder=1)
    ax.fill_between(xs, lows, highs, step="post", color=BAND_COLOUR, alpha=0.22, linewidth=0)
    ax.step(xs, ys, where="post", color=LINE_COLOUR, linewidth=2.6, zorder=3)
    for marker in timeline.markers:
        colour, style, width = MARKER_STYLES[marker.kind]
        ax.axvline(marker.interaction, color=colour, linestyle=style, linewidth=width, zorder=2)
    dots: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for move in series.moves:
        if move.stance is None:
            continue
        if move.member_id is None:
            style_of = (UNKNOWN_COLOUR, "o")
        else:
            style_of = styles.get(move.member_id, (OTHERS_COLOUR, "h"))
        dots.setdefault(style_of, []).append((move.interaction, move.stance))
    # Full size up to a few dozen moves, then smaller, so a busy belief stays legible.
    size = max(25.0, 120.0 * math.sqrt(30 / max(30, len(series.moves))))
    for (colour, shape), at in dots.items():
        ax.scatter(
            [x for x, _ in at],
            [y for _, y in at],
            s=size,
            color=colour,
            marker=shape,
            edgecolors="#000000",
            linewidths=1.2,
            zorder=5,
        )
    last = series.points[-1].stance
    ax.set_title(_short(series.topic.replace("_", " "), title_chars), loc="left")
    ax.set_title(
        "not held now" if last is None else f"now {last:+.2f}",
        loc="right",
        fontsize=13,
        color="#444444",
    )
