"""Reflection: when it is due, and the validated rewrite of the narrative.

Every reflection that ran consumes the pending insights, accepted or not: otherwise one
rejected rewrite would make every later trigger pay for the same reflection again.
"""

from __future__ import annotations

import html
import logging

from pydantic import BaseModel, ConfigDict

from sonality.config import (
    REFLECTION_SHIFT_THRESHOLD,
    SPONGE_MAX_TOKENS,
    EngineConfig,
    or_environment,
)
from sonality.llm import ChatTurn, LLMClient, LLMError, SystemBlock
from sonality.memory.updater import SNAPSHOT_CHAR_LIMIT, validate_snapshot
from sonality.opinions import structured_traits
from sonality.prompts import CORE_IDENTITY, REFLECTION_PROMPT, escape_prompt_text, prompt_lines
from sonality.state import SpongeState
from sonality.store import SEMANTIC, Episode, UsageRecord

log = logging.getLogger(__name__)

REFLECTION_MAX_OUTPUT_TOKENS = 1500
RECENT_EPISODES_FOR_REFLECTION = 30


class ReflectionOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    ran: bool
    accepted: bool = False
    reason: str = ""
    dropped_beliefs: tuple[str, ...] = ()
    old_chars: int = 0
    new_chars: int = 0
    error: str = ""


def cumulative_shift(state: SpongeState) -> float:
    """Shift magnitude since the last reflection."""
    return sum(s.magnitude for s in state.recent_shifts if s.interaction > state.last_reflection_at)


def trigger(state: SpongeState, *, config: EngineConfig | None = None) -> str | None:
    """Why a reflection is due (periodic, every `config.reflection_every`; or shift),
    or None; never before half the periodic interval. No config: the environment's."""
    every = or_environment(config).reflection_every
    since = state.interaction_count - state.last_reflection_at
    shift = cumulative_shift(state)
    periodic = since >= every
    if not (periodic or shift > REFLECTION_SHIFT_THRESHOLD):
        return None
    if since < every // 2:
        return None
    return "periodic" if periodic else f"shift {shift:.3f}"


def fit_snapshot(text: str) -> str:
    """Cut to SNAPSHOT_CHAR_LIMIT, at a sentence end where possible."""
    if len(text) <= SNAPSHOT_CHAR_LIMIT:
        return text
    cut = text[:SNAPSHOT_CHAR_LIMIT]
    end = max(cut.rfind(". "), cut.rfind(".\n"), cut.rfind("! "), cut.rfind("? "))
    return cut[: end + 1] if end > SNAPSHOT_CHAR_LIMIT // 2 else cut


def _bullets(lines: list[str], empty: str = "(none)") -> str:
    """Notes that members' messages shaped, each one bounded line (`prompt_lines`)."""
    return escape_prompt_text("\n".join(f"- {line}" for line in prompt_lines(lines)) or empty)


def prompt(state: SpongeState, recent: list[str]) -> str:
    return REFLECTION_PROMPT.format(
        current_snapshot=escape_prompt_text(state.snapshot),
        structured_traits=escape_prompt_text(structured_traits(state)),
        current_beliefs=escape_prompt_text(state.belief_summary() or "(none yet)"),
        pending_insights=_bullets(state.pending_insights),
        episode_count=len(recent),
        episode_summaries=_bullets(recent),
        recent_shifts=_bullets([f"#{s.interaction}: {s.description}" for s in state.recent_shifts]),
        max_tokens=SPONGE_MAX_TOKENS,
    )


async def rewrite(
    client: LLMClient,
    model: str,
    state: SpongeState,
    recent: list[str],
    *,
    reason: str,
    dropped: tuple[str, ...],
    version: int,
    usage: list[UsageRecord],
    episodes: list[Episode],
    label: str,
) -> ReflectionOutcome:
    """Rewrite `state`'s narrative in place if valid; the insights become semantic
    memories in `episodes`, named by `version` so no two reflections collide."""
    old_chars = len(state.snapshot)
    try:
        result = await client.reply(
            system=[SystemBlock(text=CORE_IDENTITY, cache=True)],
            messages=[ChatTurn(role="user", content=prompt(state, recent))],
            max_tokens=REFLECTION_MAX_OUTPUT_TOKENS,
            model=model,
            purpose="reflection",
        )
    except LLMError as exc:
        log.warning("%s: reflection failed (%s); state kept", label, exc)
        return ReflectionOutcome(ran=False, reason=reason, dropped_beliefs=dropped, error=str(exc))
    usage.append(UsageRecord(purpose="reflection", model=result.model, usage=result.usage))
    # The prompt showed the narrative escaped; "R&amp;D" must not be escaped again.
    candidate = fit_snapshot(html.unescape(result.text).strip())
    accepted = validate_snapshot(state.snapshot, candidate)
    episodes.extend(
        Episode(
            id=f"insight-v{version}-{index}",
            user_message=insight,
            ess_score=1.0,
            summary=insight,
            interaction=state.interaction_count,
            memory_type=SEMANTIC,
            version=version,
        )
        for index, insight in enumerate(state.pending_insights)
    )
    state.pending_insights.clear()
    if accepted:
        state.snapshot = candidate
    else:
        log.warning(
            "%s: reflection rejected (%d -> %d chars); snapshot kept",
            label,
            old_chars,
            len(candidate),
        )
    state.last_reflection_at = state.interaction_count
    return ReflectionOutcome(
        ran=True,
        accepted=accepted,
        reason=reason,
        dropped_beliefs=dropped,
        old_chars=old_chars,
        new_chars=len(candidate),
    )
