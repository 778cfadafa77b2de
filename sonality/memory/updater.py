"""The guards between model output and the stored personality: step size, snapshot
validation, and one-sentence insights that wait for reflection."""

from __future__ import annotations

from sonality.config import OPINION_BASE_RATE, SPONGE_MAX_TOKENS, EngineConfig, or_environment
from sonality.ess import ESSResult
from sonality.llm import ChatTurn, LLMClient, SystemBlock
from sonality.prompts import INSIGHT_PROMPT, INSIGHT_SYSTEM_PROMPT, escape_prompt_text
from sonality.state import SpongeState
from sonality.store import UsageRecord

SNAPSHOT_CHAR_LIMIT = SPONGE_MAX_TOKENS * 5
MIN_SNAPSHOT_RETENTION = 0.6

MIN_SNAPSHOT_CHARS = 30
NOVELTY_FLOOR = 0.1
BOOTSTRAP_DAMPENING = 0.5
INSIGHT_INPUT_CHARS = 300
INSIGHT_MAX_TOKENS = 200
# A runaway "sentence" is cut.
INSIGHT_MAX_CHARS = 500


def compute_magnitude(
    ess: ESSResult, sponge: SpongeState, *, config: EngineConfig | None = None
) -> float:
    """The step an interaction earns before resistance: small, larger for better and
    newer arguments, halved while the personality is young (its first
    `config.bootstrap_dampening_until` interactions; the environment's count when no
    config is given) so early speakers do not shape it too much."""
    young = sponge.interaction_count < or_environment(config).bootstrap_dampening_until
    dampening = BOOTSTRAP_DAMPENING if young else 1.0
    return OPINION_BASE_RATE * ess.score * max(ess.novelty, NOVELTY_FLOOR) * dampening


def validate_snapshot(old: str, new: str) -> bool:
    """Refuse a snapshot that shed detail: under 30 characters or 60% of the old one
    (whitespace-stripped)."""
    old_len, new_len = len(old.strip()), len(new.strip())
    return new_len >= MIN_SNAPSHOT_CHARS and (
        old_len == 0 or new_len / old_len >= MIN_SNAPSHOT_RETENTION
    )


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
    """One sentence on the character this exchange shows, or None; `LLMError`
    propagates."""
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
