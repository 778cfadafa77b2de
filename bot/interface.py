"""What an adapter may call on the runtime, and what the runtime expects of an adapter.

Adapters get a `ChatRuntime` and nothing else from `bot/`: that keeps every platform
quirk on the adapter's side of this line and lets tests drive adapters against a
runtime wired to loopback servers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from bot.messages import CommandRequest, CommandResult, Community, IncomingMessage, Reply
from sonality.llm import TextSink

#: Called once the runtime has decided to answer a message, before it asks the model.
Started = Callable[[], Awaitable[None]]
#: Adds a message's files (downloads its pictures): `ImageFetcher.attach`, bound.
Attach = Callable[[IncomingMessage], Awaitable[IncomingMessage]]


class ChatRuntime(Protocol):
    async def handle(
        self,
        message: IncomingMessage,
        on_text: TextSink | None = None,
        on_start: Started | None = None,
        attach: Attach | None = None,
    ) -> Reply | None:
        """Answer one message (None: ignored, e.g. empty, not addressed in a mention
        channel, anything in an `off` channel, or a free channel's message past its pace).

        `attach`, for a message with files, adds them: the runtime calls it only once
        the channel's mode and the member's flood limit let the message through, so no
        picture is downloaded for a message that gets no answer.

        `on_start` is awaited once the runtime has decided to answer, before any model
        call: the adapter shows that it is working (Discord's typing indicator, Slack's
        reaction) only for messages that will get an answer.

        With `on_text` the answer streams: the sink gets the reply's text piece by piece
        as the model writes it, and the returned `Reply` has `streamed=True` (see
        `Reply.streamed`). Notices given before any text (rate limit, spending limit,
        the model being down) come back as usual, with nothing streamed.

        Never raises for bad input or LLM faults: those come back as a NOTICE reply.
        Post-processing continues in the background after this returns.
        """
        ...

    async def person_wrote(self, community_id: str, channel_id: str) -> None:
        """A person (not a bot) wrote in a channel, in a message not handed to `handle`:
        the bot's run of replies to other bots there ends (SONALITY_BOT_EXCHANGES).
        Never raises."""
        ...

    async def run_command(self, request: CommandRequest) -> CommandResult:
        """Run one `/sonality` command; refusals and errors come back as results."""
        ...

    async def message_deleted(
        self, platform: str, message_id: str, community_id: str | None = None
    ) -> int:
        """A message was deleted on `platform` (its id as `IncomingMessage.message_id`
        gives it): what the bot kept of it and learned from it is taken back, as if it
        had never been sent, in every community that kept an answer to it.
        `community_id`, where the platform says it was (when it says), also refuses an
        answer to it still being written. Returns how many answers were taken back."""
        ...

    async def message_edited(self, platform: str, message_id: str, text: str | None) -> bool:
        """A message was edited and now says `text` (None: it is no longer addressed to
        the bot). If the bot answered it and the words changed, what it learned from the
        old words is taken back; True then tells the adapter to hand the message over
        (`handle`) as a new one."""
        ...

    async def drain(self, community_id: str | None = None) -> None:
        """Wait until learning from the messages answered so far has finished."""
        ...

    def learning_status(self, community_id: str) -> str:
        """One line on the latest learning (ESS, version, staged, insights, beliefs)."""
        ...

    async def complete(
        self, community: Community, kind: Literal["version", "topic"], prefix: str
    ) -> list[str]:
        """Autocomplete choices (version numbers or belief topics), best first, at most 25."""
        ...

    async def community_removed(self, community_id: str, reason: str) -> None:
        """The bot was removed from a community: silent there at once, its data erased
        after SONALITY_DELETE_AFTER_REMOVAL_DAYS unless it is added back first."""
        ...

    async def community_added(self, community_id: str) -> None:
        """The bot is in a community (again): a pending erasure is cancelled."""
        ...

    async def known_communities(self, platform: str) -> list[str]:
        """Ids of the platform's communities the bot keeps data for and has not been
        removed from; an adapter compares them with the platform's own list at connect
        to notice a removal that happened while the bot was offline."""
        ...


class Adapter(Protocol):
    """A platform connection started by `python -m app`."""

    name: str

    async def start(self) -> None:
        """Connect and serve until `close()`; raise `StartupError` on fatal misconfiguration."""
        ...

    async def close(self) -> None: ...


class StartupError(RuntimeError):
    """A configuration problem the admin must fix; shown as one clear line, exit code 2."""
