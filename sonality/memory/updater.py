"""How much an interaction may move a belief, whether a new snapshot is acceptable, and
what an exchange reveals about the personality's character.

Why these three live together: they are the guards between an LLM's output and the
persisted personality. The magnitude formula keeps steps small (and smaller still while
the personality is young), snapshot validation refuses reflections that would lose most
of the existing narrative, and insight extraction turns a strong exchange into one
sentence that waits for the next reflection instead of rewriting the snapshot at once.
"""

from __future__ import annotations

from sonality import config
from sonality.config import OPINION_BASE_RATE, SPONGE_MAX_TOKENS
from sonality.ess import ESSResult
from sonality.llm import ChatTurn, LLMClient, SystemBlock
from sonality.memory.sponge import SpongeState
from sonality.prompts import INSIGHT_PROMPT, INSIGHT_SYSTEM_PROMPT, escape_prompt_text
from sonality.store import UsageRecord

SNAPSHOT_CHAR_LIMIT = SPONGE_MAX_TOKENS * 5
MIN_SNAPSHOT_RETENTION = 0.6

MIN_SNAPSHOT_CHARS = 30
NOVELTY_FLOOR = 0.1
BOOTSTRAP_DAMPENING = 0.5
INSIGHT_INPUT_CHARS = 300
INSIGHT_MAX_TOKENS = 200
# An insight is one sentence; anything longer than this is cut so a runaway answer
# cannot bloat the pending-insight list.
INSIGHT_MAX_CHARS = 500


def compute_magnitude(ess: ESSResult, sponge: SpongeState) -> float:
    """Size of the belief step an interaction earns (before any confidence resistance).

    Why each factor: the base rate keeps single steps small; the score makes better
    arguments move more; novelty (floored at 0.1) stops repeated arguments from
    counting for nothing while still favouring new ones; halving during the first
    interactions keeps the earliest speakers from shaping the personality too much.
    """
    # Read at call time: the host may have configured it after this module was imported.
    young = sponge.interaction_count < config.BOOTSTRAP_DAMPENING_UNTIL
    dampening = BOOTSTRAP_DAMPENING if young else 1.0
    return OPINION_BASE_RATE * ess.score * max(ess.novelty, NOVELTY_FLOOR) * dampening


def validate_snapshot(old: str, new: str) -> bool:
    """Accept a reflected snapshot only if it kept most of the old one.

    Why: rewriting a narrative again and again tends to shed detail until it is
    generic. A new snapshot under 30 characters, or shorter than 60% of the old one,
    is rejected and the old snapshot stays. Surrounding whitespace does not count
    toward either length. With no old snapshot only the minimum length applies.
    """
    old_len = len(old.strip())
    new_len = len(new.strip())
    if new_len < MIN_SNAPSHOT_CHARS:
        return False
    if old_len == 0:
        return True
    return new_len / old_len >= MIN_SNAPSHOT_RETENTION


def _clean_insight(text: str) -> str | None:
    """First non-empty line of the answer, without wrapping quotes; None for "NONE"."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = line.strip("\"'` ").strip()
    if not line or line.rstrip(".!").upper() == "NONE":
        return None
    return line[:INSIGHT_MAX_CHARS]


async def extract_insight(
    client: LLMClient,
    ess: ESSResult,
    user_message: str,
    agent_response: str,
    *,
    model: str | None = None,
    usage_sink: list[UsageRecord] | None = None,
) -> str | None:
    """Ask for one sentence about the personality's character shown in this exchange.

    Returns None when the model finds nothing worth noting. Both sides of the exchange
    are cut to 300 characters (enough to see the style, cheap to send) and escaped.
    `LLMError` propagates; the agent decides what a failed extraction means.
    """
    prompt = INSIGHT_PROMPT.format(
        user_message=escape_prompt_text(user_message[:INSIGHT_INPUT_CHARS]),
        agent_response=escape_prompt_text(agent_response[:INSIGHT_INPUT_CHARS]),
        ess_score=f"{ess.score:.2f}",
    )
    result = await client.reply(
        system=[SystemBlock(text=INSIGHT_SYSTEM_PROMPT)],
        messages=[ChatTurn(role="user", content=prompt)],
        max_tokens=INSIGHT_MAX_TOKENS,
        model=model,
        purpose="insight",
    )
    if usage_sink is not None:
        usage_sink.append(UsageRecord(purpose="insight", model=result.model, usage=result.usage))
    return _clean_insight(result.text)
