"""Confirm and Cancel buttons under a command's question, on Discord.

Why buttons: a command that cannot be undone (`/sonality forget-me`) asks first, and on
Discord the natural answer is a button on the private question rather than typing the
command again with an option. Slack shows buttons too where the app has its agent
surface (`slack_agent`); the terminal types `confirm` instead; the
runtime's `CommandResult.confirm_args` says what confirming means for every platform.

Rules kept here: only the member who asked can press (anyone else's press is answered
privately and changes nothing); a press answers Discord at once by replacing the
question (the 3 s deadline), and the command's own answer follows as an edit; a question
nobody answered expires after `timeout` seconds, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import discord

from adapters.confirm_text import CANCELLED, NOT_YOURS, WORKING, expired_text

__all__ = ["CANCELLED", "NOT_YOURS", "WORKING", "ConfirmView", "expired_text"]

log = logging.getLogger(__name__)


class ConfirmView(discord.ui.View):
    """Confirm / Cancel for one member's question; runs `on_confirm` once on Confirm."""

    def __init__(
        self,
        *,
        owner_id: int,
        command: str,
        question: discord.Interaction,
        on_confirm: Callable[[discord.Interaction], Awaitable[None]],
        timeout: float,
    ) -> None:
        super().__init__(timeout=timeout)
        self.owner_id = owner_id
        self.command = command
        self._question = question  # its token edits the question when it expires
        self._on_confirm = on_confirm
        self._pressed = False

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if interaction.user.id == self.owner_id:
            return True
        log.info(
            "Discord: %s pressed a button of another member's /sonality %s (guild %s)",
            interaction.user.id,
            self.command,
            interaction.guild_id,
        )
        await interaction.response.send_message(NOT_YOURS, ephemeral=True)
        return False

    @discord.ui.button(label="Confirm", style=discord.ButtonStyle.danger)
    async def confirm(
        self, interaction: discord.Interaction, button: discord.ui.Button[ConfirmView]
    ) -> None:
        if not await self._first(interaction):
            return
        await interaction.response.edit_message(content=WORKING, view=None)
        await self._on_confirm(interaction)

    @discord.ui.button(label="Cancel", style=discord.ButtonStyle.secondary)
    async def cancel(
        self, interaction: discord.Interaction, button: discord.ui.Button[ConfirmView]
    ) -> None:
        if not await self._first(interaction):
            return
        await interaction.response.edit_message(content=CANCELLED, view=None)

    async def _first(self, interaction: discord.Interaction) -> bool:
        """Whether this is the question's first press. `stop()` alone does not make it
        so: discord.py starts a callback for every press it has read before either runs
        (a double click), so a later one is only acknowledged, and nothing runs twice."""
        if self._pressed:
            await interaction.response.defer()
            return False
        self._pressed = True
        self.stop()
        return True

    async def on_timeout(self) -> None:
        try:
            await self._question.edit_original_response(
                content=expired_text(self.command), view=None
            )
        except discord.HTTPException as exc:
            log.warning(
                "Discord: could not mark /sonality %s as expired (guild %s): HTTP %s %s",
                self.command,
                self._question.guild_id,
                exc.status,
                exc.text,
            )
