"""Which Slack settings belong together, checked without loading Slack's libraries.

Why a module of its own: `python -m app` refuses a half-configured Slack app before it
loads Chroma and the bot (app/startup.py), and the adapter checks the same rules when
it is built; both call `check_slack_settings`.
"""

from __future__ import annotations

from bot.interface import StartupError
from bot.settings import Settings


def check_slack_settings(settings: Settings) -> None:
    """Raise `StartupError` naming what is missing for the Slack mode the settings ask for."""
    s = settings
    if s.slack_bot_token is None and s.slack_client_id is None:
        raise StartupError(
            "Slack needs SLACK_BOT_TOKEN (one workspace) or SLACK_CLIENT_ID and "
            "SLACK_CLIENT_SECRET (installable in many workspaces)"
        )
    if s.slack_client_id is not None and s.slack_client_secret is None:
        raise StartupError("SLACK_CLIENT_ID is set but SLACK_CLIENT_SECRET is missing")
    if s.slack_app_token is not None:
        if not s.slack_app_token.get_secret_value().startswith("xapp-"):
            raise StartupError(
                "SLACK_APP_TOKEN must be an app-level token (xapp-…) with connections:write"
            )
    elif s.slack_signing_secret is None:
        raise StartupError(
            "Slack HTTP mode needs SLACK_SIGNING_SECRET (or set SLACK_APP_TOKEN for Socket Mode)"
        )
