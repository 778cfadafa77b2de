"""What a member reads around a Confirm / Cancel question, the same on every platform
that shows buttons (Discord's `discord_confirm`, Slack's `slack_agent`)."""

from __future__ import annotations

NOT_YOURS = "Only the member who asked can answer this question."
WORKING = "Working on it…"
CANCELLED = "Cancelled: nothing was changed."


def expired_text(command: str) -> str:
    return f"This question expired and nothing was changed. Run `/sonality {command}` again."
