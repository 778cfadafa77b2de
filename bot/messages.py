"""The one neutral message type in and the one neutral reply out.

Adapters translate platform events into `IncomingMessage` and render `Reply` /
`CommandResult` back; nothing past this module knows which platform spoke.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from sonality.llm import ImagePart


class Community(BaseModel):
    """A personality's home: a Discord guild, a Slack workspace, the terminal, a DM.

    `id` is globally unique and namespaced by platform ("discord:123", "slack:T042",
    "terminal:local"), so two platforms can never share a personality by accident.
    """

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=200)
    name: str = ""


#: What separates a DM personality's id from its platform or workspace part:
#: "discord:dm:<user>", "slack:<team>:dm:<user>".
DM_MARK = ":dm:"


def dm_community_id(base: str, user_id: str) -> str:
    """The id of `user_id`'s private DM personality under `base` (a platform or a
    workspace id), the same shape on every platform so `is_dm` knows it."""
    return f"{base}{DM_MARK}{user_id}"


def is_dm(community_id: str) -> bool:
    """Whether a personality is someone's direct messages with the bot, where nobody
    holds a platform role: its moderators are whoever the operator allows
    (SONALITY_DM_MODERATION), and its spending limit is the operator's default."""
    return DM_MARK in community_id


class User(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=200)
    name: str = ""
    is_bot: bool = False


class IncomingMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    community: Community
    channel_id: str
    thread_id: str | None = None
    # The platform's id of the message, unique on its platform (Discord: the message's
    # snowflake; Slack: "<channel>/<ts>"), so a deletion or an edit of it reported later
    # finds what was kept of it (`ChatRuntime.message_deleted`). None: the terminal.
    message_id: str | None = None
    user: User
    text: str
    addressed: bool = True  # @mention, reply to the bot, DM, or terminal line
    # The operator at the bot's own terminal: not a member to protect the bot from, so
    # never flood-limited. Only the terminal adapter sets it.
    trusted: bool = False
    # Pictures attached to the message, downloaded and checked by the adapter
    # (bot/images.py); they go to the model with the text and are never stored.
    images: tuple[ImagePart, ...] = ()
    # What became of attached files that are not in `images`, one short sentence each
    # for the member ("report.pdf is not an image I can look at.").
    file_notes: tuple[str, ...] = ()


class ReplyKind(StrEnum):
    ANSWER = "answer"  # the personality's reply
    NOTICE = "notice"  # a short system message: rate limited, LLM unavailable, ...


class Reply(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    kind: ReplyKind = ReplyKind.ANSWER
    truncated: bool = False  # the incoming message was cut before the engine saw it
    # Text went to the adapter's stream sink before this reply came back. An ANSWER is
    # then the whole reply (the shown text plus any note the runtime added); a NOTICE
    # is what to put after the text already shown (a stream that broke part-way).
    streamed: bool = False


class CommandRequest(BaseModel):
    """`/sonality <name> <args...>` from any platform."""

    model_config = ConfigDict(frozen=True)

    community: Community
    caller: User
    is_moderator: bool  # decided by the adapter (Manage Server, workspace admin, ...)
    name: str
    args: tuple[str, ...] = ()
    # As for `IncomingMessage`: the operator at the terminal is never flood-limited.
    trusted: bool = False
    # Where the command was run (a thread counts as its parent channel, as for
    # messages), and that channel's name for lists; None where there is no channel.
    channel_id: str | None = None
    channel_name: str = ""
    # Why this platform cannot read members' messages that do not address the bot
    # here, in one line naming what to change ("" : it can); `channel free` refuses
    # with it, since a free channel would answer nothing more than a mention channel.
    free_refusal: str = ""


class Attachment(BaseModel):
    """A file a command answers with (a picture, an export); each adapter delivers it
    its own platform's way: a Discord attachment, a Slack upload, a file on disk."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, max_length=200)  # a plain file name, no directories
    data: bytes
    mime_type: str = "application/octet-stream"
    description: str = ""  # alt text for screen readers, where the platform takes it


# The start of the names of the command files that quote or name members: the terminal
# saves them in the data directory, and deletes them when a member is forgotten.
MY_DATA_FILE_PREFIX = "sonality-my-data-"
TIMELINE_FILE_PREFIX = "timeline-v"


class CommandResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    ok: bool = True
    # Refusals and errors are best shown only to the caller (ephemeral) where possible.
    private: bool = False
    title: str = ""
    files: tuple[Attachment, ...] = ()
    # A question to confirm: running the same command with `confirm_args` goes ahead.
    # An adapter with buttons shows `button_text` with Confirm and Cancel instead of
    # `text`, which says how to type the confirmation.
    confirm_args: tuple[str, ...] = ()
    button_text: str = ""


# What people see when something goes wrong, the same wording on every platform.
LLM_DOWN = "Sorry, I can't reach my language model right now. Please try again in a minute."
INTERNAL_ERROR = "Sorry, something went wrong on my side. Nothing was lost; please try again."
CUT_OFF = (
    "(My reply was cut off here, so I learned nothing from this message. "
    "Please ask again in a moment.)"
)
SLOW_DOWN = "You're sending messages faster than I can think. Please slow down a little."
REMOVED = (
    "I'm no longer part of this community, so I don't answer commands here. If I'm added "
    "back, everything I kept will be as it was, until it is erased."
)
SHARE_REACHED = (
    "You've used your share of today's spending limit here, so I'll leave the rest of "
    "today to the others and answer you again tomorrow."
)
BUDGET_REACHED = (
    "I've reached today's spending limit for this community, so I'm resting until "
    "tomorrow. A moderator can raise it with /sonality budget."
)
