"""The community runtime: one neutral message in, one neutral reply out.

Everything that is about *people in a community* rather than about a platform lives
here: ignoring what isn't for the bot, flood control, cutting huge messages, per-user
conversation memory, routing to the right community's agent, and turning faults into
a short apology instead of silence or a stack trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from bot.bot_exchanges import BotExchanges
from bot.budget import SPENDER, BudgetExceeded, BudgetLedger, MemberShareExceeded, Spender
from bot.channels import ChannelMode, ChannelModes, Hearing
from bot.commands import CommandHandlers, describe_ess, ranked_topics
from bot.community_removal import CommunityRemovals
from bot.deletion import message_ref, take_back
from bot.forget_journal import ForgetJournal
from bot.interface import Attach, Started
from bot.messages import (
    BUDGET_REACHED,
    CUT_OFF,
    INTERNAL_ERROR,
    LLM_DOWN,
    REMOVED,
    SHARE_REACHED,
    SLOW_DOWN,
    CommandRequest,
    CommandResult,
    Community,
    IncomingMessage,
    Reply,
    ReplyKind,
    User,
)
from bot.ratelimit import RateLimiter, SharedRateLimiter, Verdict
from bot.registry import CommunityRegistry
from bot.settings import Settings
from sonality.agent import SonalityAgent
from sonality.ess import normalize_topic
from sonality.llm import ChatTurn, LLMError, TextSink
from sonality.prompts import member_words, with_image_note
from sonality.store import Speaker
from storage import Database
from storage.deletion import DeletionCause, MessageDeletion

if TYPE_CHECKING:
    from chroma_memory.hosts import MemoryHost

__all__ = ["Runtime"]

log = logging.getLogger(__name__)

TOUCH_EVERY = timedelta(minutes=1)


@dataclass(frozen=True, eq=False)
class _Answering:
    """A message being answered: where, and the words the answer is to."""

    community_id: str
    text: str


def _same_words(kept: str, words: str) -> bool:
    """Whether `words`, an update's text, are those of `kept`, a message as answered:
    kept with the note `with_image_note` added when pictures came with it, which an
    update (the words alone) does not carry. A message that merely ends like a note is
    kept as it was written, so it is compared as it is too."""
    return kept == words or member_words(kept) == words


def _platform(community: Community) -> str:
    """ "discord" of "discord:123" (and of "discord:dm:42")."""
    return community.id.split(":", 1)[0]


class Runtime:
    """Implements `bot.interface.ChatRuntime`."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        registry: CommunityRegistry,
        memory: MemoryHost | None = None,
        budget: BudgetLedger | None = None,
    ) -> None:
        self.settings = settings
        self.memory = memory  # where episodes live (benchmarks read its counters)
        self.db = db
        self.registry = registry
        # Shared with the agents' `MeteredLLM`s (see `open_runtime`), so a refusal here
        # and a refusal there speak of the same spend.
        self.budget = budget or BudgetLedger.from_settings(db, settings)
        self.rate_limiter = RateLimiter(
            settings.rate_limit_messages, settings.rate_limit_window_seconds
        )
        # Several processes on one PostgreSQL database count floods together; one process
        # (SQLite) keeps counting in memory only.
        self.shared_limiter = (
            SharedRateLimiter(db, self.rate_limiter) if db.coordinator is not None else None
        )
        # The forget-me journal's copy outside the database (bot/forget_journal.py).
        self.forget_journal = ForgetJournal.in_data_dir(settings.data_dir)
        # Each channel's mode (mention, free, off) and the pace of free channels.
        self.channels = ChannelModes(
            db,
            ChannelMode(settings.channel_mode),
            settings.free_channel_seconds,
            shared=db.coordinator is not None,
        )
        self.commands = CommandHandlers(
            db,
            self._current_agent,
            lambda: self.next_nightly,
            self.budget,
            self.forget_journal,
            channels=self.channels,
            dm_moderation=settings.dm_moderation,
        )
        self._accepting = True
        self.next_nightly: datetime | None = None  # set by the scheduler
        # Wall-clock time of each community's latest message, for idle-time reflection.
        self.last_message_at: dict[str, datetime] = {}
        self._background: set[asyncio.Task[None]] = set()
        # The messages being answered now, by `message_ref`: a deletion or an edit that
        # comes before the answer is recorded must still refuse it (bot/deletion.py).
        self._answering: dict[str, list[_Answering]] = {}
        self._touched: dict[str, tuple[datetime, str]] = {}
        # Communities the bot was removed from: silent there, erased after the grace
        # period (bot/community_removal.py). `open_runtime` loads it and wires Chroma's part.
        self.removals = CommunityRemovals(
            db, registry, settings.delete_after_removal_days, on_erased=self._forget_caches
        )
        # Other bots answered (SONALITY_ANSWER_BOTS), a few times in a row per channel.
        self.bot_exchanges = BotExchanges(db, settings.answer_bot_ids, settings.bot_exchanges)

    # ------------------------------------------------------------------ messages
    async def handle(
        self,
        message: IncomingMessage,
        on_text: TextSink | None = None,
        on_start: Started | None = None,
        attach: Attach | None = None,
    ) -> Reply | None:
        if message.user.is_bot:
            return await self._handle_bot(message, on_text, on_start, attach)
        if self._accepting and not self.removals.is_removed(message.community.id):
            await self.bot_exchanges.person_wrote(message.community.id, message.channel_id)
        return await self._answer(message, on_text, on_start, attach)

    async def person_wrote(self, community_id: str, channel_id: str) -> None:
        await self.bot_exchanges.person_wrote(community_id, channel_id)

    async def _handle_bot(
        self,
        message: IncomingMessage,
        on_text: TextSink | None,
        on_start: Started | None,
        attach: Attach | None,
    ) -> Reply | None:
        """Another bot's message: answered only if the operator listed it, at most
        SONALITY_BOT_EXCHANGES times in a row in the channel, and never learned from."""
        community = message.community
        if (
            not self._accepting
            or not message.addressed
            or not self.bot_exchanges.may_answer(message.user.id)
            or self.removals.is_removed(community.id)
            or not message.text.strip()
        ):
            return None
        if await self._hearing(message) is Hearing.SILENT:
            return None  # an `off` channel: no reply, so none counted against the run
        if not await self.bot_exchanges.claim(community.id, message.channel_id):
            return None
        reply = await self._answer(message, on_text, on_start, attach, learn=False)
        if reply is not None and reply.kind is ReplyKind.NOTICE and not reply.streamed:
            # "Slow down", "spending limit reached", "model unavailable" are for people;
            # to a bot they would only be one more message to answer.
            return None
        return reply

    async def _answer(
        self,
        message: IncomingMessage,
        on_text: TextSink | None,
        on_start: Started | None,
        attach: Attach | None = None,
        *,
        learn: bool = True,
    ) -> Reply | None:
        """Answer one message as its channel's mode says (`bot.channels`); with `learn`
        off, nothing of it is learned. Its files are attached (`attach`) once the
        channel's mode and the flood limit let it through."""
        if not self._accepting:
            return None
        if self.removals.is_removed(message.community.id):
            return None  # removed from there: not a word until it is added back
        text = message.text.strip()
        if not text and not message.images and not message.file_notes and attach is None:
            return None
        community, user = message.community, message.user
        hearing = await self._hearing(message)
        if hearing is Hearing.SILENT:
            return None
        # Unprompted (a free channel's message that did not address the bot): paced per
        # channel, and never a notice, since nobody asked for an answer.
        unprompted = hearing is Hearing.UNPROMPTED
        if unprompted and not self.channels.turn_due(community.id, message.channel_id):
            return None
        verdict = await self._flood_verdict(community.id, user.id, message.trusted)
        if verdict is Verdict.DROP or (unprompted and verdict is Verdict.WARN):
            log.info("dropping flood message from %s in %s", user.id, community.id)
            return None
        if verdict is Verdict.WARN:
            log.info("rate limited %s in %s", user.id, community.id)
            return Reply(text=SLOW_DOWN, kind=ReplyKind.NOTICE)
        # From here the message is being answered: an edit or a deletion that arrives
        # while its pictures download or its agent loads takes it back as well
        # (`message_edited`, and `asked_at` for the record).
        arrived = datetime.now(UTC)
        text = text[: self.settings.max_message_chars]
        ref = (
            ""
            if message.message_id is None
            else message_ref(_platform(community), message.message_id)
        )
        with self._answering_now(ref, _Answering(community.id, text)):
            return await self._answer_now(
                message,
                text,
                ref=ref,
                arrived=arrived,
                unprompted=unprompted,
                on_text=on_text,
                on_start=on_start,
                attach=attach,
                learn=learn,
            )

    async def _answer_now(
        self,
        message: IncomingMessage,
        text: str,
        *,
        ref: str,
        arrived: datetime,
        unprompted: bool,
        on_text: TextSink | None,
        on_start: Started | None,
        attach: Attach | None,
        learn: bool,
    ) -> Reply | None:
        """`_answer` once the message is let through (`text`: its words, cut to the
        longest the bot reads): its files, the budget, the model."""
        community, user = message.community, message.user
        limit = self.settings.max_message_chars
        truncated = len(message.text.strip()) > limit
        if truncated:
            log.info(
                "cut a %d-char message from %s in %s", len(message.text), user.id, community.id
            )
        if attach is not None:
            message = await attach(message)
            if not text and not message.images and not message.file_notes:
                return None
        if not text and not message.images:
            # Only files the model cannot see: say why, and ask the model nothing.
            if unprompted:
                return None
            return Reply(text=" ".join(message.file_notes), kind=ReplyKind.NOTICE)
        if unprompted and not self.channels.take_turn(community.id, message.channel_id):
            return None
        if on_start is not None:
            await self._started(on_start)

        # Characters handed to the adapter's sink so far ([] until the first piece).
        shown: list[int] = []

        async def counted(piece: str) -> None:
            shown[:] = [(shown[0] if shown else 0) + len(piece)]
            assert on_text is not None
            await on_text(piece)

        sink = counted if on_text is not None else None

        spender = SPENDER.set(Spender(user.id, limited=not message.trusted))
        try:
            if await self.budget.exhausted(community.id):
                return None if unprompted else await self._budget_notice(community.id, user.id)
            if not message.trusted and await self.budget.member_over_share(community.id, user.id):
                return None if unprompted else await self._share_notice(community.id, user.id)
            agent = await self.registry.agent_for(community)
            now = datetime.now(UTC)
            self.last_message_at[community.id] = now
            history = self._history(community.id, user.id, now)  # read during retrieval
            reply = await agent.respond(
                text,
                _speaker(user),
                history,
                on_text=sink,
                images=message.images,
                message_ref=ref,
                learn=learn,
                asked_at=arrived,
            )
        except MemberShareExceeded:  # spent while this message waited for its turn
            return None if unprompted else await self._share_notice(community.id, user.id)
        except BudgetExceeded:  # reached while this message waited for its turn
            return None if unprompted else await self._budget_notice(community.id, user.id)
        except LLMError as exc:
            if shown:
                # The member saw part of an answer: say where it ends. The agent recorded
                # nothing, so nothing is learned from a reply nobody received whole.
                log.warning(
                    "reply cut off in %s for %s after %d characters; nothing learned: %s",
                    community.id,
                    user.id,
                    shown[0],
                    exc,
                )
                return Reply(text=CUT_OFF, kind=ReplyKind.NOTICE, streamed=True)
            log.warning("no reply in %s for %s: %s", community.id, user.id, exc)
            return None if unprompted else Reply(text=LLM_DOWN, kind=ReplyKind.NOTICE)
        except Exception:
            log.exception("failed to answer in %s for %s", community.id, user.id)
            return None if unprompted else Reply(text=INTERNAL_ERROR, kind=ReplyKind.NOTICE)
        finally:
            SPENDER.reset(spender)

        # The reply is already durable in the outbox (which also notes the activity); the
        # conversation buffer and the community's name are written after it leaves, so
        # the person waits for nothing but the model, not for a queue of SQLite writes.
        kept = with_image_note(text, len(message.images))  # as the agent recorded it
        self._spawn(self._after_reply(community, user.id, kept, reply, now, ref))
        # Ids and sizes only: a DEBUG log must never hold what a member wrote.
        log.debug(
            "answered %s in %s: %d chars in, %d out", user.id, community.id, len(text), len(reply)
        )
        if truncated:
            reply += (
                f"\n\n(Your message was very long, so I only read its first {limit:,} characters.)"
            )
        if message.file_notes:
            reply += "\n\n(" + " ".join(message.file_notes) + ")"
        return Reply(text=reply, truncated=truncated, streamed=bool(shown))

    async def _hearing(self, message: IncomingMessage) -> Hearing:
        """The channel's mode applied to `message`. If the modes cannot be read, the
        channel counts as a mention channel: addressed messages are still answered."""
        try:
            return await self.channels.hearing(message)
        except Exception:
            log.exception("could not read the channel modes of %s", message.community.id)
            return Hearing.ANSWER if message.addressed else Hearing.SILENT

    @staticmethod
    async def _started(on_start: Started) -> None:
        """Tell the adapter an answer is coming (its typing indicator); its failure
        must not cost the answer."""
        try:
            await on_start()
        except Exception:
            log.exception("the adapter's start-of-answer hook failed")

    async def _flood_verdict(self, community_id: str, user_id: str, trusted: bool) -> Verdict:
        """One count per member for messages and commands alike (see `bot.ratelimit`)."""
        if trusted:
            return Verdict.ALLOW
        if self.shared_limiter is not None:
            return await self.shared_limiter.check(community_id, user_id)
        return self.rate_limiter.check(community_id, user_id)

    async def _budget_notice(self, community_id: str, user_id: str) -> Reply | None:
        """Past the daily limit each member is told once a day; after that, silence
        (a reply to every message would only be noise)."""
        if await self.budget.first_notice_today(community_id, user_id):
            log.info("spending limit reached in %s: told %s", community_id, user_id)
            return Reply(text=BUDGET_REACHED, kind=ReplyKind.NOTICE)
        return None

    async def _share_notice(self, community_id: str, user_id: str) -> Reply | None:
        """A member past their share of the day is told once a day, whichever process
        sees their message; the community's other members are still answered."""
        if await self.budget.first_share_notice_today(community_id, user_id):
            log.info("member share spent in %s: told %s", community_id, user_id)
            return Reply(text=SHARE_REACHED, kind=ReplyKind.NOTICE)
        return None

    def _needs_touch(self, community: Community, now: datetime) -> bool:
        """Community bookkeeping (name, first sight) is written at most once a minute."""
        seen = self._touched.get(community.id)
        if seen is not None and seen[1] == community.name and now - seen[0] < TOUCH_EVERY:
            return False
        self._touched[community.id] = (now, community.name)
        return True

    async def _after_reply(
        self, community: Community, user_id: str, text: str, reply: str, now: datetime, ref: str
    ) -> None:
        if self._needs_touch(community, now):
            try:
                await self.db.touch_community(community.id, community.name, now)
            except Exception:
                log.exception("could not note the name of %s", community.id)
        try:
            # Not if the member ran forget-me, or deleted the message, while the reply
            # was written (`now` is when their message came in).
            await self.db.append_exchange(
                community.id, user_id, text, reply, datetime.now(UTC), asked_at=now, message_ref=ref
            )
        except Exception:
            # The interaction itself is in the outbox; only short-term memory missed a turn.
            log.exception("could not store the conversation turn in %s", community.id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _history(self, community_id: str, user_id: str, now: datetime) -> list[ChatTurn]:
        if self.settings.buffer_turns <= 0:
            return []
        cutoff = now - timedelta(minutes=self.settings.buffer_ttl_minutes)
        turns = await self.db.recent_turns(
            community_id,
            user_id,
            max_turns=self.settings.buffer_turns,
            max_chars=self.settings.buffer_chars,
            not_older_than=cutoff,
            # The window moves by two thirds of its exchanges at a time, so a member's
            # earlier turns stay a cached prompt prefix for several messages.
            step_pairs=max(1, self.settings.buffer_turns // 3),
        )
        return [ChatTurn(role=role, content=content) for role, content in turns]

    @contextlib.contextmanager
    def _answering_now(self, ref: str, answering: _Answering) -> Iterator[None]:
        if not ref:
            yield
            return
        self._answering.setdefault(ref, []).append(answering)
        try:
            yield
        finally:
            left = [a for a in self._answering.pop(ref, []) if a is not answering]
            if left:
                self._answering[ref] = left

    # ------------------------------------------------------------------ deletions, edits
    async def message_deleted(
        self, platform: str, message_id: str, community_id: str | None = None
    ) -> int:
        ref = message_ref(platform, message_id)
        answering = self._answering.get(ref)
        where = community_id or (answering[0].community_id if answering else None)
        return len(await self._take_back(ref, "deleted", where))

    async def message_edited(self, platform: str, message_id: str, text: str | None) -> bool:
        ref = message_ref(platform, message_id)
        answering = self._answering.get(ref, [])
        olds = [old for _, old in await self.db.kept_messages(ref)]
        olds += [a.text for a in answering]
        if not olds:
            return False  # never answered: an edit is not a new message to the bot
        new = None if text is None else text.strip()[: self.settings.max_message_chars]
        if new is not None and all(_same_words(old, new) for old in olds):
            return False  # the same words (a link preview, an embed): nothing to do
        where = answering[0].community_id if answering else None
        await self._take_back(ref, "edited", where)
        return bool(new)

    async def _take_back(
        self, ref: str, cause: DeletionCause, community_id: str | None
    ) -> list[MessageDeletion]:
        return await take_back(
            self.db,
            self.registry.agent_by_id,
            ref,
            cause,
            community_id=community_id,
            journal=self.forget_journal,
        )

    # ------------------------------------------------------------------ commands
    async def _current_agent(self, community: Community) -> SonalityAgent:
        """The community's agent, holding the latest stored state: with several
        processes on one database another one may have learned since (on SQLite this
        costs nothing)."""
        agent = await self.registry.agent_for(community)
        await agent.catch_up()
        return agent

    async def run_command(self, request: CommandRequest) -> CommandResult:
        # Commands cost work too (a timeline is seconds of CPU, `reflect` model calls),
        # so they count with the caller's messages, moderators' included. A command over
        # the limit is still answered, privately: a slash command left unanswered shows
        # the caller an error, and nobody else sees the answer.
        if self.removals.is_removed(request.community.id):
            # The bot left: its data there only waits for erasure. A client's cached
            # command list can still send commands; they must neither show nor change it.
            log.info("/sonality %s refused in %s: removed", request.name, request.community.id)
            return CommandResult(text=REMOVED, ok=False, private=True)
        verdict = await self._flood_verdict(
            request.community.id, request.caller.id, request.trusted
        )
        if verdict is not Verdict.ALLOW:
            log.info(
                "rate limited /sonality %s by %s in %s",
                request.name,
                request.caller.id,
                request.community.id,
            )
            return CommandResult(text=SLOW_DOWN, ok=False, private=True)
        log.debug(
            "command %s (%d args) by %s in %s",
            request.name,
            len(request.args),
            request.caller.id,
            request.community.id,
        )
        try:
            return await self.commands.run(request)
        except LLMError as exc:
            log.warning("command %s in %s: %s", request.name, request.community.id, exc)
            return CommandResult(text=LLM_DOWN, ok=False, private=True)
        except Exception:
            log.exception("command %s failed in %s", request.name, request.community.id)
            return CommandResult(text=INTERNAL_ERROR, ok=False, private=True)

    async def complete(
        self, community: Community, kind: Literal["version", "topic"], prefix: str
    ) -> list[str]:
        if self.removals.is_removed(community.id):
            return []  # as `run_command`: nothing of a community the bot left
        try:
            if kind == "version":
                prefix = prefix.strip()
                versions = await self.db.community(community.id).versions(limit=200)
                return [str(v.version) for v in versions if str(v.version).startswith(prefix)][:25]
            agent = await self.registry.agent_for(community)
            return ranked_topics(agent.sponge, normalize_topic(prefix))[:25]
        except Exception:
            log.exception("autocomplete failed in %s", community.id)
            return []

    # ------------------------------------------------------------------ membership
    async def community_removed(self, community_id: str, reason: str) -> None:
        """The platform says the bot is no longer in the community (kicked, left, app
        uninstalled, tokens revoked)."""
        await self.removals.removed(community_id, reason)

    async def community_added(self, community_id: str) -> None:
        """The bot is (again) in the community; cancels a pending erasure."""
        await self.removals.added_back(community_id)

    async def known_communities(self, platform: str) -> list[str]:
        prefix = f"{platform}:"
        return [
            cid
            for cid in await self.db.community_ids()
            if cid.startswith(prefix) and not self.removals.is_removed(cid)
        ]

    def _forget_caches(self, community_id: str) -> None:
        self.channels.forget(community_id)
        self.last_message_at.pop(community_id, None)
        self._touched.pop(community_id, None)

    # ------------------------------------------------------------------ lifecycle
    async def drain(self, community_id: str | None = None) -> None:
        """Wait for background work (tests, terminal status line, shutdown)."""
        await self._wait_background()
        await self.registry.drain(community_id)

    def learning_status(self, community_id: str) -> str:
        agent = self.registry.get(community_id)
        if agent is None:
            return ""
        state, ess = agent.sponge, agent.last_ess
        parts = [] if ess is None else [describe_ess(ess)]
        parts += [
            f"v{state.version}",
            f"staged {len(state.staged_opinion_updates)}",
            f"insights {len(state.pending_insights)}",
            f"beliefs {len(state.opinion_vectors)}",
        ]
        return " · ".join(parts)

    async def _wait_background(self) -> None:
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def stop_accepting(self) -> None:
        self._accepting = False

    async def close(self) -> None:
        self.stop_accepting()
        await self._wait_background()
        await self.commands.timelines.close()
        await self.registry.close_all()
        await self.budget.flush()  # what members spent, learning's last calls included


def _speaker(user: User) -> Speaker:
    """Who the model is told wrote the message; another bot is named as one."""
    if user.is_bot:
        return Speaker(id=user.id, name=f"{user.name or 'another bot'} (a bot)")
    return Speaker(id=user.id, name=user.name)
