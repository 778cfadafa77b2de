"""`/sonality` commands, one platform-neutral handler each, returning plain text.

Adapters decide who is a moderator and how to show the text; this module decides
what is allowed and what it says. Every moderator-only attempt is recorded, refused
or not, so a community can see who tried to rewrite its personality.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from bot.messages import MODERATOR_COMMANDS, CommandRequest, CommandResult, Community
from sonality import config
from sonality.agent import RollbackError, SonalityAgent, cumulative_shift
from sonality.ess import normalize_topic
from sonality.memory.sponge import SpongeState
from storage import Database

log = logging.getLogger(__name__)

AgentLookup = Callable[[Community], Awaitable[SonalityAgent]]
NextReflection = Callable[[], datetime | None]

HELP = """\
/sonality beliefs [topic]   what I currently think, how sure I am and why
/sonality history [count]   recent versions of my personality and what changed
/sonality diff <a> <b>      compare two versions
/sonality snapshot [version] my self-description (current or at a version)
/sonality status            interactions, beliefs, updates in waiting, next reflection
/sonality rollback <version> [reason]   moderators: restore a version (undoable)
/sonality reflect           moderators: consolidate what I've learned now
/sonality help              this list"""

MAX_LIST = 15


def _fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "-"


def ranked_topics(state: SpongeState, key: str = "") -> list[str]:
    """Belief topics containing `key`, strongest stance first (shared with autocomplete)."""
    opinions = state.opinion_vectors
    return [t for t in sorted(opinions, key=lambda t: (-abs(opinions[t]), t)) if key in t]


class CommandHandlers:
    def __init__(
        self,
        db: Database,
        agent_for: AgentLookup,
        next_reflection: NextReflection,
    ) -> None:
        self._db = db
        self._agent_for = agent_for
        self._next_reflection = next_reflection

    async def run(self, request: CommandRequest) -> CommandResult:
        name = request.name.strip().lower()
        handler = getattr(self, f"_cmd_{name}", None)
        if handler is None:
            return CommandResult(
                text=f"Unknown command `{request.name}`.\n\n{HELP}", ok=False, private=True
            )
        if name in MODERATOR_COMMANDS:
            allowed = request.is_moderator
            await self._db.record_moderator_action(
                request.community.id,
                actor_id=request.caller.id,
                actor_name=request.caller.name,
                action=name,
                args=" ".join(request.args),
                reason="" if allowed else "refused: not a moderator",
                allowed=allowed,
            )
            if not allowed:
                log.info(
                    "refused /sonality %s by %s in %s (not a moderator)",
                    name,
                    request.caller.id,
                    request.community.id,
                )
                return CommandResult(
                    text=f"Only moderators can use `/sonality {name}`.", ok=False, private=True
                )
        try:
            result: CommandResult = await handler(request)
            return result
        except _UsageError as exc:
            return CommandResult(text=str(exc), ok=False, private=True)

    # ------------------------------------------------------------------ read-only
    async def _cmd_help(self, request: CommandRequest) -> CommandResult:
        return CommandResult(text=HELP, title="Sonality commands", private=True)

    async def _cmd_beliefs(self, request: CommandRequest) -> CommandResult:
        agent = await self._agent_for(request.community)
        state = agent.sponge
        if not state.opinion_vectors and not state.staged_opinion_updates:
            return CommandResult(
                text="I hold no beliefs yet: nobody has given me a strong enough argument.",
                title="Beliefs",
            )
        query = normalize_topic(" ".join(request.args))
        topics = ranked_topics(state, query)
        staged = [u for u in state.staged_opinion_updates if query in u.topic]
        if not topics and not staged:
            return CommandResult(text=f"I have no belief about `{query}`.", ok=False, private=True)
        lines = []
        for topic in topics[:MAX_LIST]:
            value = state.opinion_vectors[topic]
            meta = state.belief_meta.get(topic)
            stance = "for" if value > 0 else "against" if value < 0 else "undecided"
            line = f"• {topic}: {value:+.2f} ({stance})"
            if meta:
                line += (
                    f", confidence {meta.confidence:.2f}, evidence {meta.evidence_count}, "
                    f"last reinforced at interaction {meta.last_reinforced}"
                )
                if meta.provenance:
                    line += f"\n    why: {meta.provenance}"
            lines.append(line)
        if len(topics) > MAX_LIST:
            lines.append(f"… and {len(topics) - MAX_LIST} more (ask for a topic).")
        if staged:
            lines.append("Still weighing (commits after the cooling period):")
            lines.extend(
                f"• {u.topic}: {u.signed_magnitude:+.3f}, due at interaction {u.due_interaction}"
                for u in staged[:MAX_LIST]
            )
        return CommandResult(text="\n".join(lines), title="Beliefs")

    async def _cmd_history(self, request: CommandRequest) -> CommandResult:
        limit = _int_arg(request.args, 0, default=10, name="count", low=1, high=50)
        store = self._db.community(request.community.id)
        versions = await store.versions(limit=limit)
        if not versions:
            return CommandResult(text="No versions yet.", title="History")
        lines = [
            f"v{v.version}  {_fmt_time(v.created_at)}  [{v.cause}"
            + (f" by {v.actor}" if v.actor else "")
            + f"] {v.change}"
            for v in versions
        ]
        return CommandResult(text="\n".join(lines), title="History")

    async def _cmd_snapshot(self, request: CommandRequest) -> CommandResult:
        if request.args:
            version = _int_arg(request.args, 0, default=0, name="version", low=0)
            state = await self._db.community(request.community.id).state_at(version)
            if state is None:
                raise _UsageError(f"There is no version {version}.")
        else:
            state = (await self._agent_for(request.community)).sponge
        return CommandResult(text=state.snapshot, title=f"Snapshot v{state.version}")

    async def _cmd_diff(self, request: CommandRequest) -> CommandResult:
        if len(request.args) < 2:
            raise _UsageError("Usage: `/sonality diff <a> <b>` (two version numbers).")
        a = _int_arg(request.args, 0, default=0, name="a", low=0)
        b = _int_arg(request.args, 1, default=0, name="b", low=0)
        store = self._db.community(request.community.id)
        old, new = await store.state_at(a), await store.state_at(b)
        missing = [str(v) for v, s in ((a, old), (b, new)) if s is None]
        if old is None or new is None:
            raise _UsageError(f"There is no version {', '.join(missing)}.")
        return CommandResult(text=diff_states(old, new), title=f"Diff v{a} → v{b}")

    async def _cmd_status(self, request: CommandRequest) -> CommandResult:
        agent = await self._agent_for(request.community)
        state = agent.sponge
        totals = await self._db.usage_totals(request.community.id)
        nxt = self._next_reflection()
        remaining = max(
            0, state.last_reflection_at + config.REFLECTION_EVERY - state.interaction_count
        )
        lines = [
            f"Version: v{state.version}",
            f"Interactions: {state.interaction_count}",
            f"Beliefs: {len(state.opinion_vectors)}",
            f"Staged updates: {len(state.staged_opinion_updates)}",
            f"Pending insights: {len(state.pending_insights)}",
            f"Shift since last reflection: {cumulative_shift(state):.3f}",
            f"Last reflection at interaction: {state.last_reflection_at}",
            f"Next reflection: after {remaining} more interaction(s)"
            + (f", or at the nightly run {_fmt_time(nxt)}" if nxt else ""),
            f"Waiting to be processed: {agent.backlog}",
            f"Tokens used: {totals.input_tokens} in / {totals.output_tokens} out "
            f"(cache read {totals.cache_read_tokens}, cache write {totals.cache_write_tokens})",
        ]
        if agent.last_ess is not None:
            e = agent.last_ess
            lines.append(
                f"Last message: ESS {e.score:.2f} ({e.reasoning_type}, {e.opinion_direction})"
            )
        return CommandResult(text="\n".join(lines), title="Status")

    # ------------------------------------------------------------------ moderators
    async def _cmd_rollback(self, request: CommandRequest) -> CommandResult:
        if not request.args:
            raise _UsageError("Usage: `/sonality rollback <version> [reason]`.")
        version = _int_arg(request.args, 0, default=0, name="version", low=0)
        reason = " ".join(request.args[1:]).strip()
        agent = await self._agent_for(request.community)
        before = agent.sponge.version
        actor = f"{request.caller.name or request.caller.id} ({request.caller.id})"
        try:
            restored = await agent.rollback(version, actor=actor, reason=reason)
        except RollbackError as exc:
            raise _UsageError(f"Cannot roll back: {exc}.") from exc
        log.info(
            "rollback in %s to v%d by %s (now v%d)",
            request.community.id,
            version,
            request.caller.id,
            restored.version,
        )
        return CommandResult(
            text=(
                f"Restored v{version} as v{restored.version}. "
                f"To undo, `/sonality rollback {before}`."
            ),
            title="Rollback",
        )

    async def _cmd_reflect(self, request: CommandRequest) -> CommandResult:
        agent = await self._agent_for(request.community)
        await agent.drain()
        outcome = await agent.reflect_now("moderator", actor=request.caller.id)
        if not outcome.ran:
            return CommandResult(
                text=f"Reflection could not run: {outcome.error or 'no answer'}. Nothing changed.",
                ok=False,
                private=True,
            )
        if outcome.accepted:
            text = (
                f"Reflected: my self-description went from {outcome.old_chars} to "
                f"{outcome.new_chars} characters (now v{agent.sponge.version})."
            )
        else:
            text = "I reflected, but the result lost too much of who I am, so I kept the old one."
        if outcome.dropped_beliefs:
            text += " Faded beliefs: " + ", ".join(outcome.dropped_beliefs) + "."
        return CommandResult(text=text, title="Reflect")


class _UsageError(ValueError):
    """Bad command arguments; shown to the caller only."""


def _int_arg(
    args: tuple[str, ...],
    index: int,
    *,
    default: int,
    name: str,
    low: int | None = None,
    high: int | None = None,
) -> int:
    if len(args) <= index:
        return default
    raw = args[index].strip().lstrip("v")
    try:
        value = int(raw)
    except ValueError:
        raise _UsageError(f"`{args[index]}` is not a valid {name} (a whole number).") from None
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low if low is not None else ''}..{high if high is not None else ''}"
        raise _UsageError(f"{name} must be in {bounds}.")
    return value


def diff_states(old: SpongeState, new: SpongeState) -> str:
    """A readable difference between two versions: counters, beliefs, narrative."""
    lines = [
        f"Interactions: {old.interaction_count} → {new.interaction_count}",
        f"Beliefs: {len(old.opinion_vectors)} → {len(new.opinion_vectors)}",
    ]
    topics = sorted(set(old.opinion_vectors) | set(new.opinion_vectors))
    for topic in topics:
        a, b = old.opinion_vectors.get(topic), new.opinion_vectors.get(topic)
        if a == b:
            continue
        if a is None:
            lines.append(f"+ {topic}: {b:+.3f}")
        elif b is None:
            lines.append(f"- {topic}: was {a:+.3f}")
        else:
            lines.append(f"~ {topic}: {a:+.3f} → {b:+.3f}")
    if len(old.pending_insights) != len(new.pending_insights):
        lines.append(f"Pending insights: {len(old.pending_insights)} → {len(new.pending_insights)}")
    if old.snapshot == new.snapshot:
        lines.append("Narrative: unchanged")
    else:
        lines.append("Narrative:")
        diff = difflib.unified_diff(
            _sentences(old.snapshot), _sentences(new.snapshot), lineterm="", n=0
        )
        lines.extend(line for line in diff if not line.startswith(("---", "+++", "@@")))
    return "\n".join(lines)


def _sentences(text: str) -> list[str]:
    parts = text.replace("\n", " ").split(". ")
    return [p.strip() + ("" if p.strip().endswith(".") else ".") for p in parts if p.strip()]
