"""`/sonality` commands, one platform-neutral handler each, returning plain text.

Adapters decide who is a moderator and how to show the text; this module decides
what is allowed and what it says. Every moderator-only attempt is recorded, refused
or not, so a community can see who tried to rewrite its personality.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import date, datetime, timedelta

from bot.budget import (
    BudgetLedger,
    BudgetStatus,
    SpendLimit,
    format_tokens,
    format_usd,
    member_share_lines,
    own_share_lines,
    total_tokens,
)
from bot.channels import ChannelModes, run_channel_command
from bot.command_table import HISTORY_MAX_COUNT, USAGE_MAX_DAYS, command, help_text
from bot.forget_journal import ForgetJournal
from bot.forget_me import forget_member, reapply_after_rollback, resolve_member
from bot.messages import (
    CommandRequest,
    CommandResult,
    Community,
    User,
    is_dm,
)
from bot.mydata import run_my_data
from bot.timeline import UNNAMED_MEMBER, Timelines, member_names
from providers.pricing import ModelPrice, cost_usd
from sonality.agent import RollbackError, SonalityAgent, cumulative_shift
from sonality.ess import ESSResult, normalize_topic
from sonality.state import MoveSource, SpongeState
from sonality.store import VersionInfo
from storage import USAGE_ROLES, DailyUsage, Database, UsageRole
from storage.feedback import FeedbackCounts

log = logging.getLogger(__name__)

AgentLookup = Callable[[Community], Awaitable[SonalityAgent]]
NextReflection = Callable[[], datetime | None]

HELP = help_text()

MAX_LIST = 15


#: How a reasoning type reads to people (the engine's names are code).
REASONING_WORDS = {
    "logical_argument": "a reasoned argument",
    "empirical_data": "evidence with data",
    "expert_opinion": "an expert's view",
    "anecdotal": "an anecdote",
    "social_pressure": "social pressure",
    "emotional_appeal": "an emotional appeal",
    "no_argument": "no argument",
}


def describe_ess(ess: ESSResult) -> str:
    """One message's rating in words: "ESS 0.74, evidence with data, for nuclear_energy"."""
    words = REASONING_WORDS.get(str(ess.reasoning_type), str(ess.reasoning_type))
    text = f"ESS {ess.score:.2f}, {words}"
    if ess.topics:
        side = {"supports": "for ", "opposes": "against "}.get(str(ess.opinion_direction), "on ")
        text += f", {side}{ess.topics[0]}"
    return text


def feedback_line(counts: FeedbackCounts) -> str:
    """Members' presses of the feedback buttons under replies, in one status line."""
    replies = "reply" if counts.replies == 1 else "replies"
    return (
        f"Reply feedback: {counts.positive} 👍, {counts.negative} 👎 "
        f"(on {counts.replies} {replies})"
    )


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
        budget: BudgetLedger,
        forget_journal: ForgetJournal | None = None,
        *,
        channels: ChannelModes,
        dm_moderation: bool = False,
    ) -> None:
        self._db = db
        self._channels = channels
        self._agent_for = agent_for
        self._next_reflection = next_reflection
        self._budget = budget
        self._dm_moderation = dm_moderation
        self._forget_journal = forget_journal
        self.timelines = Timelines(db)  # its worker process and kept answers

    async def run(self, request: CommandRequest) -> CommandResult:
        name = request.name.strip().lower()
        if request.is_moderator and is_dm(request.community.id) and not self._dm_moderation:
            # Whatever an adapter decided: in a DM nobody holds a platform role, so only
            # the operator's SONALITY_DM_MODERATION makes its member a moderator.
            request = request.model_copy(update={"is_moderator": False})
        spec = command(name)
        handler = getattr(self, f"_cmd_{name.replace('-', '_')}", None)
        if spec is None or handler is None:
            return CommandResult(
                text=f"Unknown command `{request.name}`.\n\n{HELP}", ok=False, private=True
            )
        if spec.needs_moderator(request.args) and not spec.audits_itself:
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
        if spec.missing(request.args) and not spec.audits_itself:
            return CommandResult(text=f"Usage: `/sonality {spec.usage()}`.", ok=False, private=True)
        if problem := spec.bad_choice(request.args):
            return CommandResult(
                text=f"{problem} Usage: `/sonality {spec.usage()}`.", ok=False, private=True
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
        names = await self._member_names(request.community, state)
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
                if meta.moved_by:
                    line += f"\n    last moved by {credit_text(meta.moved_by, names)}"
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
        """Versions where something a moderator would see changed; runs of plain chat
        between them are folded into one line. `history all [count]` lists every one."""
        args = request.args
        show_all = bool(args) and args[0].strip().lower() == "all"
        if show_all:
            args = args[1:]
        limit = _int_arg(args, 0, default=10, name="count", low=1, high=HISTORY_MAX_COUNT)
        store = self._db.community(request.community.id)
        # Read further back than shown: a commit's credit names the argument's rating,
        # which its own (earlier) version records.
        versions = await store.versions(limit=HISTORY_SCAN)
        if not versions:
            return CommandResult(text="No versions yet.", title="History")
        ratings = {v.version: m.group(0) for v in versions if (m := _RATING.match(v.change))}
        if show_all:
            credits = await self._move_credits(request.community, versions[:limit], ratings)
            every = [_fmt_version(v, credits.get(v.version)) for v in versions[:limit]]
            return CommandResult(text="\n".join(every), title="History")
        notable = [v for v in versions if _notable(v)][: limit + 1]
        credits = await self._move_credits(request.community, notable, ratings)
        lines: list[str] = []
        folded: list[VersionInfo] = []  # plain chat since the last version shown
        shown = 0
        for version in versions:  # newest first
            if not _notable(version):
                folded.append(version)
                continue
            if shown == limit:
                break
            if folded:
                lines.append(_fold(folded))
                folded = []
            lines.append(_fmt_version(version, credits.get(version.version)))
            shown += 1
        if folded:
            lines.append(_fold(folded))
        return CommandResult(text="\n".join(lines), title="History")

    async def _member_names(self, community: Community, *states: SpongeState) -> dict[str, str]:
        """How the members credited in `states` are shown (`member_names`)."""
        members = {
            source.member
            for state in states
            for meta in state.belief_meta.values()
            for source in meta.moved_by
        }
        return await member_names(self._db, community.id, members)

    async def _move_credits(
        self, community: Community, versions: list[VersionInfo], ratings: Mapping[int, str]
    ) -> dict[int, dict[str, str]]:
        """For each version that committed an opinion move, per topic, the arguments that
        caused it: member, version and rating, read from the committed state (the commit
        itself is often just the message that closed the cooling period, and must not
        take the credit)."""
        wanted = [v for v in versions if "committed" in v.change]
        if not wanted:
            return {}
        store = self._db.community(community.id)
        states = await store.states_at(v.version for v in wanted)
        names = await self._member_names(community, *states.values())
        credits: dict[int, dict[str, str]] = {}
        for version in wanted:
            state = states.get(version.version)
            if state is None:
                continue
            moved = {
                topic: credit_text(meta.moved_by, names, ratings)
                for topic, meta in sorted(state.belief_meta.items())
                if meta.moved_by and meta.last_reinforced == version.interaction_count
            }
            if moved:
                credits[version.version] = moved
        return credits

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
        a = _int_arg(request.args, 0, default=0, name="version", low=0)
        b = _int_arg(request.args, 1, default=0, name="version", low=0)
        store = self._db.community(request.community.id)
        old, new = await store.state_at(a), await store.state_at(b)
        missing = [str(v) for v, s in ((a, old), (b, new)) if s is None]
        if old is None or new is None:
            raise _UsageError(f"There is no version {', '.join(missing)}.")
        return CommandResult(
            text=diff_states(old, new) or "No differences.", title=f"Diff v{a} → v{b}"
        )

    async def _cmd_status(self, request: CommandRequest) -> CommandResult:
        agent = await self._agent_for(request.community)
        state = agent.sponge
        totals = await self._db.usage_totals(request.community.id)
        spend = await self._budget.status(request.community.id)
        nxt = self._next_reflection()
        remaining = max(
            0, state.last_reflection_at + agent.config.reflection_every - state.interaction_count
        )
        lines = [
            f"Version: v{state.version}",
            f"Interactions: {state.interaction_count}",
            f"Beliefs: {len(state.opinion_vectors)}",
            f"Staged updates: {len(state.staged_opinion_updates)}",
            f"Pending insights: {len(state.pending_insights)}",
            f"Shift since last reflection: {cumulative_shift(state):.3f}",
            "Last reflection: "
            + (
                f"at interaction {state.last_reflection_at}"
                if state.last_reflection_at
                else "none yet"
            ),
            f"Next reflection: after {remaining} more interaction(s)"
            + (f", or at the nightly run {_fmt_time(nxt)}" if nxt else ""),
            f"Waiting to be processed: {agent.backlog}",
            f"Tokens used: {totals.input_tokens} in / {totals.output_tokens} out "
            f"(cache read {totals.cache_read_tokens}, cache write {totals.cache_write_tokens})",
            *_spend_lines(spend),
        ]
        if agent.last_ess is not None:
            e = agent.last_ess
            lines.append(f"Last message: {describe_ess(e)}")
        if not is_dm(request.community.id):
            lines.append(
                await self._channels.status_line(request.community.id, names=request.is_moderator)
            )
        if request.is_moderator:  # members' votes are for those who run the community
            feedback = await self._db.feedback_counts(request.community.id)
            if feedback.total:
                lines.append(feedback_line(feedback))
        return CommandResult(text="\n".join(lines), title="Status")

    async def _cmd_usage(self, request: CommandRequest) -> CommandResult:
        days = _int_arg(request.args, 0, default=7, name="days", low=1, high=USAGE_MAX_DAYS)
        cid = request.community.id
        today = self._budget.today()
        month_start = today.replace(day=1)
        first = min(today - timedelta(days=days - 1), month_start)
        rows = await self._db.usage_days(cid, first, today)
        spend = await self._budget.status(cid)
        text = render_usage(
            rows,
            today=today,
            days=days,
            prices=self._budget.prices,
            timezone=str(self._budget.tz),
            limit=spend.limit,
        )
        # Members' shares of today: every member's for moderators, one's own otherwise.
        spent = await self._budget.member_spent(cid)
        share = await self._budget.share_usd(cid)
        if request.is_moderator:
            names = await self._db.speaker_names(cid, spent)
            lines = member_share_lines(spent, names, spend, share)
        else:
            lines = own_share_lines(spent.get(request.caller.id, 0.0), spend, share)
        return CommandResult(text="\n".join([text, *lines]), title="Usage")

    async def _cmd_channel(self, request: CommandRequest) -> CommandResult:
        return await run_channel_command(self._channels, request)

    async def _cmd_timeline(self, request: CommandRequest) -> CommandResult:
        return await self.timelines.run(request)

    async def _cmd_my_data(self, request: CommandRequest) -> CommandResult:
        agent = await self._agent_for(request.community)
        return await run_my_data(self._db, agent, request)

    async def _cmd_budget(self, request: CommandRequest) -> CommandResult:
        cid = request.community.id
        raw = " ".join(request.args).strip().lower()
        if not raw:
            spend = await self._budget.status(cid)
            return CommandResult(text="\n".join(_spend_lines(spend)), title="Budget")
        actor = actor_name(request.caller)
        if raw in ("off", "none", "unlimited"):
            limit = await self._budget.set_limit(cid, None, set_by=actor)
        elif raw == "default":
            limit = await self._budget.follow_default(cid)
        else:
            limit = await self._budget.set_limit(cid, _usd_arg(raw), set_by=actor)
        log.info(
            "daily limit in %s set to %s by %s",
            cid,
            _limit_text(limit),
            request.caller.id,
            extra={"community": cid},
        )
        # Learning held back by the old limit may go on now (a no-op if none waits).
        (await self._agent_for(request.community)).resume_learning()
        spend = await self._budget.status(cid)
        return CommandResult(text="\n".join(_spend_lines(spend)), title="Budget")

    # ------------------------------------------------------------------ moderators
    async def _cmd_forget_me(self, request: CommandRequest) -> CommandResult:
        """Any member, for themselves; nothing happens without `confirm` (typed on Slack
        and at the terminal, a Confirm button on Discord)."""
        if not request.args or request.args[0].strip().lower() != "confirm":
            question = (
                "This forgets you in this community: your messages and my replies to "
                "them, and their influence on my opinions (recomputed as if you had "
                "never argued). Past versions keep their "
                "opinions but show you only under a pseudonym. It cannot be undone."
            )
            return CommandResult(
                text=f"{question} To go ahead: `/sonality forget-me confirm`.",
                title="Forget me?",
                private=True,
                confirm_args=("confirm",),
                button_text=f"{question} Press Confirm to go ahead.",
            )
        return await self._forget(request, request.caller.id, requested_by="self", reason="")

    async def _cmd_forget_user(self, request: CommandRequest) -> CommandResult:
        """Moderators, for a member who asked them. Logged with the moderator and the
        reason, never with the member's id (the log would otherwise remember them).
        The member is one the community has seen, named exactly (`resolve_member`)."""
        members = await self._db.community_members(request.community.id)
        target = resolve_member(members, request.args)
        reason = target.reason.strip()
        allowed = request.is_moderator
        logged = reason
        if not allowed:
            logged = "refused: not a moderator"
        elif target.member is None:  # the "reason" may hold part of a name then
            logged = "refused: no single member named"
        await self._db.record_moderator_action(
            request.community.id,
            actor_id=request.caller.id,
            actor_name=request.caller.name,
            action="forget-user",
            args="(member withheld)",
            reason=logged,
            allowed=allowed,
        )
        if not allowed:
            return CommandResult(
                text="Only moderators can use `/sonality forget-user`.", ok=False, private=True
            )
        if not target.named or not reason:
            raise _UsageError("Usage: `/sonality forget-user <member> <reason>`.")
        if target.candidates:
            listed = ", ".join(f"{m.name or m.id} ({m.id})" for m in target.candidates)
            one_name = len({(m.name or m.id).casefold() for m in target.candidates}) == 1
            which = (
                f"Several members here are called {target.named}"
                if one_name
                else "The start of that line names several members here"
            )
            raise _UsageError(
                f"{which}: {listed}. Name one by mention or id. Nothing was forgotten."
            )
        if target.member is None:
            raise _UsageError(
                f"No member called {target.named} has spoken or run a command here (name "
                "them by mention, id or the name they use here). Nothing was forgotten."
            )
        return await self._forget(
            request, target.member.id, requested_by=actor_name(request.caller), reason=reason
        )

    async def _forget(
        self, request: CommandRequest, member: str, *, requested_by: str, reason: str
    ) -> CommandResult:
        agent = await self._agent_for(request.community)
        before = agent.sponge
        done = await forget_member(
            self._db,
            agent,
            request.community.id,
            member,
            requested_by=requested_by,
            reason=reason,
            journal=self._forget_journal,
        )
        # Their part of today's spend goes as their stored rows did (a process starting
        # reads the stored figures, so a forget-me finished at start needs nothing more).
        self._budget.forget_member(request.community.id, member)
        if done.version is None:
            return CommandResult(
                text="Nothing to forget: I keep nothing of theirs in this community."
                if requested_by != "self"
                else "Nothing to forget: I keep nothing of yours in this community.",
                title="Forgotten",
                private=True,
            )
        moved = diff_states(before, agent.sponge) or "No opinion changed."
        # Only a reflection writes members into the self-description: before the first
        # one it is still the seed's, and there is nothing of theirs to wait for.
        narrative = (
            "\nMy self-description still reflects them until the next reflection rewrites it "
            "without their insights; a moderator can run `/sonality reflect` to do that now."
            if before.last_reflection_at > 0
            else ""
        )
        return CommandResult(
            text=(
                f"Forgotten, as {done.pseudonym}: messages, replies and their influence on my "
                f"opinions (v{done.version}).\n{moved}{narrative}"
            ),
            title="Forgotten",
            private=True,
        )

    async def _cmd_rollback(self, request: CommandRequest) -> CommandResult:
        version = _int_arg(request.args, 0, default=0, name="version", low=0)
        reason = " ".join(request.args[1:]).strip()
        agent = await self._agent_for(request.community)
        before = agent.sponge.version
        actor = actor_name(request.caller)
        try:
            restored = await agent.rollback(version, actor=actor, reason=reason)
        except RollbackError as exc:
            raise _UsageError(f"Cannot roll back: {exc}.") from exc
        # A forget-me after the target must stay in force: replay the opinions again.
        if await reapply_after_rollback(self._db, agent, request.community.id, version):
            restored = agent.sponge
        log.info(
            "rollback in %s to v%d by %s (now v%d)",
            request.community.id,
            version,
            request.caller.id,
            restored.version,
            extra={"community": request.community.id},
        )
        if version == 0:
            text = (
                f"Reset to the seed personality as v{restored.version}: no beliefs, the "
                "first self-description, and no memories of earlier conversations."
            )
        else:
            text = (
                f"Restored v{version} as v{restored.version}. Memories from after "
                f"v{version} are out of reach."
            )
        return CommandResult(
            text=f"{text} To undo, `/sonality rollback {before}`.",
            title="Rollback",
        )

    async def _cmd_reflect(self, request: CommandRequest) -> CommandResult:
        if await self._budget.exhausted(request.community.id):
            # Learning waits for tomorrow's budget, so draining it first would hang.
            return CommandResult(
                text="Reflection needs the model, and today's spending limit is reached. "
                "Raise it with `/sonality budget` or wait until midnight.",
                ok=False,
                private=True,
            )
        agent = await self._agent_for(request.community)
        await agent.drain()
        state = agent.sponge
        if not state.pending_insights and state.interaction_count == state.last_reflection_at:
            return CommandResult(
                text="Nothing to reflect on: no conversations or observations since my last "
                "reflection. Nothing changed.",
                title="Reflect",
            )
        outcome = await agent.reflect_now("moderator", actor=actor_name(request.caller))
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


#: The largest whole number SQLite stores. A larger one cannot even be looked up (the
#: binding raises OverflowError), so every command number is checked against it first.
MAX_COMMAND_NUMBER = 2**63 - 1
#: The highest daily limit a moderator can set, in dollars: more is "off" in practice,
#: and a number like 1e308 would be answered with three hundred digits.
MAX_DAILY_LIMIT_USD = 100_000
#: How much of a bad argument an answer repeats (a pasted wall of digits stays short).
MAX_SHOWN_ARG = 24


def _int_arg(
    args: tuple[str, ...],
    index: int,
    *,
    default: int,
    name: str,
    low: int | None = None,
    high: int | None = None,
) -> int:
    """A whole-number argument within its bounds. Without an upper bound the number
    names something to look up (a version), so one too large to be stored is answered
    as what it is: there is no such thing."""
    if len(args) <= index:
        return default
    raw = args[index].strip().lstrip("v")
    try:
        value = int(raw)
    except ValueError:  # also a number of more than 4,300 digits
        raise _UsageError(
            f"`{_shown_arg(args[index])}` is not a valid {name} (a whole number)."
        ) from None
    if high is None and value > MAX_COMMAND_NUMBER:
        raise _UsageError(f"There is no {name} {_shown_arg(str(value))}.")
    if (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            bounds = f"between {low} and {high}"
        else:
            bounds = f"at least {low}" if low is not None else f"at most {high}"
        raise _UsageError(f"The {name} must be {bounds}.")
    return value


def _shown_arg(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_ARG else text[: MAX_SHOWN_ARG - 1] + "…"


def _usd_arg(raw: str) -> float:
    text = raw.strip().lstrip("$").replace(",", "")
    try:
        value = float(text)
    except ValueError:
        raise _UsageError(
            f"`{raw}` is not an amount. Usage: `/sonality budget <usd>|off|default`, "
            "e.g. `/sonality budget 2.50`."
        ) from None
    if not math.isfinite(value) or value < 0:
        raise _UsageError("The daily limit must be a number of dollars, 0 or more.")
    if value > MAX_DAILY_LIMIT_USD:
        raise _UsageError(
            f"The daily limit must be at most ${MAX_DAILY_LIMIT_USD:,} a day; "
            "`/sonality budget off` removes it."
        )
    return value


def _limit_text(limit: SpendLimit) -> str:
    if limit.usd is None:
        return "no limit" + (" (turned off by a moderator)" if limit.source == "community" else "")
    where = "set for this community" if limit.source == "community" else "default"
    return f"{format_usd(limit.usd)} a day ({where})"


def _spend_lines(spend: BudgetStatus) -> list[str]:
    """Today's spend and the limit, with the warning once it is near."""
    lines = [
        f"Today: {format_tokens(total_tokens(spend.usage))} tokens, "
        f"{format_usd(spend.spent_usd)} (estimated)",
        f"Daily limit: {_limit_text(spend.limit)}",
    ]
    if spend.limit.usd is not None:
        if spend.exhausted:
            lines.append("Limit reached: I'm not answering until midnight.")
        elif spend.near_limit:
            share = spend.spent_usd / spend.limit.usd
            lines.append(f"Warning: {share:.0%} of today's limit is spent.")
    return lines


def render_usage(
    rows: list[DailyUsage],
    *,
    today: date,
    days: int,
    prices: Mapping[str, ModelPrice],
    timezone: str,
    limit: SpendLimit,
) -> str:
    """Today, each of the last `days` days and this month, in tokens and estimated USD,
    split by role; at most 60 characters wide so it reads in a chat window."""
    tokens: dict[tuple[date, UsageRole], int] = {}
    usd: dict[tuple[date, UsageRole], float] = {}
    for row in rows:
        key = (row.day, row.role)
        tokens[key] = tokens.get(key, 0) + total_tokens(row.usage)
        usd[key] = usd.get(key, 0.0) + cost_usd(row.model, row.usage, prices)

    def period(title: str, first: date, last: date) -> list[str]:
        keys = [k for k in tokens if first <= k[0] <= last]
        all_tokens = sum(tokens[k] for k in keys)
        all_usd = sum(usd[k] for k in keys)
        out = [f"{title}: {format_tokens(all_tokens)} tokens, {format_usd(all_usd)}"]
        for role in USAGE_ROLES:
            role_tokens = sum(tokens[k] for k in keys if k[1] == role)
            role_usd = sum(usd[k] for k in keys if k[1] == role)
            out.append(f"  {role:<11}{format_tokens(role_tokens):>8}  {format_usd(role_usd):>9}")
        return out

    month_start = today.replace(day=1)
    lines = [f"Estimated cost in USD; days end at midnight {timezone}.", ""]
    lines += period(f"Today ({today:%a %d %b})", today, today)
    lines += ["", f"Last {days} day{'s' if days != 1 else ''}:"]
    lines.append(f"{'':<10}{'tokens':>8}{'reply':>10}{'evidence':>10}{'reflection':>12}")
    for offset in range(days):
        day = today - timedelta(days=offset)
        cells = [format_usd(usd.get((day, role), 0.0)) for role in USAGE_ROLES]
        day_tokens = sum(tokens.get((day, role), 0) for role in USAGE_ROLES)
        lines.append(
            f"{day:%a %d %b}{format_tokens(day_tokens):>8}"
            f"{cells[0]:>10}{cells[1]:>10}{cells[2]:>12}"
        )
    lines.append("")
    lines += period(f"This month ({today:%B})", month_start, today)
    lines += ["", f"Daily limit: {_limit_text(limit)}"]
    return "\n".join(lines)


#: Versions `history` reads back to find the notable ones among plain chat.
HISTORY_SCAN = 500
#: A message version's rating, as its change line starts: "ESS 0.90".
_RATING = re.compile(r"ESS \d+\.\d+")
#: Causes that are always worth a line; an interaction is when it committed, decayed or
#: reflected.
_NOTABLE_CAUSES = frozenset(
    {"seed", "rollback", "reflection", "decay", "forget-me", "message-deleted", "budget"}
)
_NOTABLE_CHANGES = ("staged", "committed", "reflection", "decayed")


def _notable(version: VersionInfo) -> bool:
    if version.cause in _NOTABLE_CAUSES:
        return True
    return any(word in version.change for word in _NOTABLE_CHANGES)


def _actors(actor: str, shown: int = 2) -> str:
    """A version's actor at chat width: messages taken back together list every one."""
    names = actor.split(", ")
    if len(names) <= shown + 1:
        return actor
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def _fmt_version(v: VersionInfo, credits: Mapping[str, str] | None = None) -> str:
    """One version's line. A commit comes first, each topic with the arguments that
    moved it; the message it happened during follows as "during: …", since a cooling
    period often ends on a message that argued nothing."""
    actor = _actors(v.actor) if v.actor and v.cause == "message-deleted" else v.actor
    who = f" by {actor}" if actor else ""
    change = v.change
    if credits:
        parts = change.split(" | ")
        commits = [p for p in parts if p.startswith("committed ")]
        rest = [p for p in parts if not p.startswith("committed ")]
        shown = []
        for part in commits:
            items = part.removeprefix("committed ").split("; ")
            shown.append(
                "committed "
                + "; ".join(
                    f"{item}, argued by {credits[item.split()[0]]}"
                    if item.split() and item.split()[0] in credits
                    else item
                    for item in items
                )
            )
        change = " | ".join([*shown, *(["during: " + " | ".join(rest)] if rest else [])])
    return f"v{v.version}  {_fmt_time(v.created_at)}  [{v.cause}{who}] {change}"


def _fold(run: list[VersionInfo]) -> str:
    """One line for a run of versions where nothing a moderator sees changed."""
    low, high = min(v.version for v in run), max(v.version for v in run)
    span = f"v{low}" if low == high else f"v{low}–v{high}"
    noun = "message" if len(run) == 1 else "messages"
    return f"   … {len(run)} chat {noun} ({span}): no opinion or narrative changed"


def credit_text(
    sources: list[MoveSource], names: Mapping[str, str], ratings: Mapping[int, str] = {}
) -> str:
    """ "Alice (v5, ESS 0.90), Bob (v7)": the members whose updates were netted into one
    move, the versions that staged them and, where known, their rating, largest
    contribution first. A member is shown as `names` has them (`bot.timeline.member_names`:
    the name stored with their messages, or a forgotten member's pseudonym), else as
    "a member": never by their platform id."""
    parts = []
    for source in sources:
        who = names.get(source.member) or UNNAMED_MEMBER
        where = [f"v{source.version}"] if source.version else []
        if source.version in ratings:
            where.append(ratings[source.version])
        parts.append(f"{who} ({', '.join(where)})" if where else who)
    return ", ".join(parts)


def actor_name(user: User) -> str:
    """How a member is named in history and audit: "Name (id)", the same everywhere."""
    return f"{user.name} ({user.id})" if user.name and user.name != user.id else user.id


def diff_states(old: SpongeState, new: SpongeState) -> str:
    """What changed between two versions, and only that: counters, beliefs, updates
    still cooling, narrative (empty when nothing did)."""
    lines = []
    if old.interaction_count != new.interaction_count:
        lines.append(f"Interactions: {old.interaction_count} → {new.interaction_count}")
    if len(old.opinion_vectors) != len(new.opinion_vectors):
        lines.append(f"Beliefs: {len(old.opinion_vectors)} → {len(new.opinion_vectors)}")
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
    if old.staged_opinion_updates != new.staged_opinion_updates:
        if new.staged_opinion_updates:
            lines.append("Still cooling in the newer version:")
            lines.extend(
                f"  {u.topic} {u.signed_magnitude:+.3f}, commits at interaction {u.due_interaction}"
                for u in new.staged_opinion_updates[:MAX_LIST]
            )
        else:
            lines.append("Still cooling in the newer version: nothing")
    if old.snapshot != new.snapshot:
        lines.append("Narrative:")
        diff = difflib.unified_diff(
            _sentences(old.snapshot), _sentences(new.snapshot), lineterm="", n=0
        )
        lines.extend(line for line in diff if not line.startswith(("---", "+++", "@@")))
    return "\n".join(lines)


def _sentences(text: str) -> list[str]:
    parts = text.replace("\n", " ").split(". ")
    return [p.strip() + ("" if p.strip().endswith(".") else ".") for p in parts if p.strip()]
