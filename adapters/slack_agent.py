"""Slack's agent surface: suggested prompts, feedback buttons, Confirm / Cancel buttons.

What Slack offers an app declared with `features.agent_view` (slack/manifest.yml), and
what the adapter builds from it here, in Slack's own block models (slack_sdk):

* Suggested prompts in the member's DM with the bot, set when they open its Messages
  tab (`app_home_opened`, tab "messages"), so a new member sees what to ask.
* Feedback buttons (thumbs up / down) at the end of a streamed reply; a press comes
  back as a `block_actions` interaction and is counted per reply (`storage.feedback`).
* Confirm / Cancel under a question such as forget-me's, as on Discord.

Why the `assistant:write` scope decides whether buttons are shown: a press reaches the
bot only when the app has interactivity turned on, which Slack does not report to the
bot. The current manifest adds that scope and interactivity together, so an app created
from an older manifest (neither) keeps the text flow it had (`/sonality forget-me
confirm`) instead of showing buttons that would do nothing.

Why a question's state travels in its button's value: the button comes back, signed by
Slack, with exactly what was put in it (who asked, which personality, which command),
so a press is answered correctly after a restart, and its age says when it expired.
The adapter still checks what it reads there: the presser must be the asker, the
personality this workspace's (or the asker's DM with it), the command a real one.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, ValidationError
from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ContextActionsBlock,
    FeedbackButtonsElement,
    MarkdownTextObject,
    SectionBlock,
)
from slack_sdk.models.blocks.basic_components import FeedbackButtonObject

__all__ = [
    "AGENT_SCOPE",
    "CANCEL_ACTION",
    "CONFIRM_ACTION",
    "FEEDBACK_ACTION",
    "NEGATIVE",
    "POSITIVE",
    "PROMPTS_TITLE",
    "SUGGESTED_PROMPTS",
    "Question",
    "feedback_blocks",
    "has_agent_surface",
    "question_blocks",
]

#: The scope of the agent surface (prompts, thinking status); see the module docstring.
AGENT_SCOPE = "assistant:write"

PROMPTS_TITLE = "Ask me about my views"
#: title: what the prompt shows; message: what the member sends by picking it.
SUGGESTED_PROMPTS: tuple[dict[str, str], ...] = (
    {
        "title": "What do you believe about…?",
        "message": "What do you believe about the topics people here have argued with you?",
    },
    {
        "title": "How did your views change this week?",
        "message": "How did your views change this week, and who changed them?",
    },
    {
        "title": "What would change your mind?",
        "message": "What would change your mind about the views you hold most firmly?",
    },
)

FEEDBACK_ACTION = "sonality_feedback"
POSITIVE = "positive"
NEGATIVE = "negative"
CONFIRM_ACTION = "sonality_confirm"
CANCEL_ACTION = "sonality_cancel"
#: Slack's limit on a section's text.
SECTION_LIMIT = 3000


def has_agent_surface(bot_scopes: Sequence[str] | None) -> bool:
    """Whether the app was set up from the current manifest (see the module docstring)."""
    return bot_scopes is not None and AGENT_SCOPE in bot_scopes


def feedback_blocks() -> list[Block]:
    """Thumbs up / down under a reply (Slack's context_actions block)."""
    return [
        ContextActionsBlock(
            elements=[
                FeedbackButtonsElement(
                    action_id=FEEDBACK_ACTION,
                    positive_button=FeedbackButtonObject(
                        text="👍",
                        accessibility_label="This reply was helpful",
                        value=POSITIVE,
                    ),
                    negative_button=FeedbackButtonObject(
                        text="👎",
                        accessibility_label="This reply was not helpful",
                        value=NEGATIVE,
                    ),
                )
            ]
        )
    ]


class Question(BaseModel):
    """A command's question waiting for Confirm or Cancel, as its buttons carry it."""

    model_config = ConfigDict(frozen=True)

    owner: str  # the member who asked: the only one whose press counts
    community: str  # the personality the command was about
    command: str
    confirm_args: tuple[str, ...]  # running the command with these goes ahead
    asked_at: float  # Unix time
    nonce: str  # tells two questions apart, so each is answered once

    @classmethod
    def ask(
        cls, owner: str, community: str, command: str, confirm_args: tuple[str, ...]
    ) -> Question:
        return cls(
            owner=owner,
            community=community,
            command=command,
            confirm_args=confirm_args,
            asked_at=time.time(),
            nonce=secrets.token_hex(8),
        )

    def encode(self) -> str:
        return self.model_dump_json()

    @classmethod
    def decode(cls, raw: object) -> Question | None:
        """The question a button carried; None for a value this bot did not write."""
        try:
            return cls.model_validate(json.loads(str(raw)))
        except (ValueError, ValidationError):
            return None

    def expired(self, timeout: float) -> bool:
        return time.time() - self.asked_at > timeout


def question_blocks(text: str, question: Question) -> list[Block]:
    """The question's text with Confirm (red) and Cancel under it."""
    value = question.encode()
    return [
        SectionBlock(text=MarkdownTextObject(text=text[:SECTION_LIMIT])),
        ActionsBlock(
            elements=[
                ButtonElement(
                    text="Confirm", action_id=CONFIRM_ACTION, value=value, style="danger"
                ),
                ButtonElement(text="Cancel", action_id=CANCEL_ACTION, value=value),
            ]
        ),
    ]
