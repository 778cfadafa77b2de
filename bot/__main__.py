"""`python -m bot`: start every configured platform, or the terminal community."""

from __future__ import annotations

import asyncio
import logging
import sys

from pydantic import ValidationError

from bot.interface import StartupError
from bot.settings import Settings


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = first.get("loc", ("?",))[0]
        print(f"error: invalid setting {name}: {first.get('msg')}", file=sys.stderr)
        return 2
    if settings.anthropic_api_key is None or not settings.anthropic_api_key.get_secret_value():
        print(
            "error: set ANTHROPIC_API_KEY (in the environment or in .env) to run the bot.",
            file=sys.stderr,
        )
        return 2
    interactive_terminal = not (settings.discord_enabled or settings.slack_enabled)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.FileHandler(settings.data_dir / "sonality.log")]
    stderr = logging.StreamHandler()
    # In the terminal community, chat owns the screen: only problems go to stderr.
    stderr.setLevel(logging.WARNING if interactive_terminal else settings.log_level.upper())
    handlers.append(stderr)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
    )
    from bot.app import run_bot

    try:
        return asyncio.run(run_bot(settings))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
