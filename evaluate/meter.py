"""Counting what the evaluation spends, and refusing to start a step that would pass
the operator's `--max-usd`.

Why a wrapper around the client and not the bot's `BudgetLedger`: the ledger refuses a
call by raising inside learning, which then waits for midnight; an evaluation must
instead stop *between* steps, with every community's state consistent, and still
write what it measured. So the runner asks `ensure_room` before each step (a chat
message and the learning it triggers, one ESS call, one judge call), and the meter
prices every call from the usage the provider actually reported.

Why estimates learn from the run: before the first call of a kind, only a rough token
guess exists (the prompt sizes below). After it, the most expensive call of that kind
seen so far, with a margin, predicts the next one far better than any guess.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from providers.forwarding import ForwardingLLM
from providers.pricing import ModelPrice, cost_usd
from sonality.llm import LLMClient, TextResult, ToolResult, Usage

log = logging.getLogger(__name__)

#: Rough (input, output) tokens of one call of each kind, before any call was seen.
#: reply: core identity, personality, memories and a few turns of conversation;
#: ess: the classification guide, the personality and the tool schema;
#: judge: the rubric, the position and the reply being graded.
PRIOR_TOKENS: dict[str, tuple[int, int]] = {
    "reply": (1600, 300),
    "ess": (1400, 180),
    "insight": (600, 60),
    "reflection": (1500, 600),
    "judge": (700, 120),
}
#: The next call of a kind is assumed to cost this much more than the dearest one seen.
ESTIMATE_MARGIN = 1.25

#: (purpose, model) of one call a step is expected to make.
PlannedCall = tuple[str, str]


class SpendLimitReached(Exception):
    """The next step would take the spend past `--max-usd`; nothing of it was started."""

    def __init__(self, spent_usd: float, limit_usd: float, next_usd: float) -> None:
        super().__init__(
            f"--max-usd {limit_usd:.2f} reached: ${spent_usd:.4f} spent, and the next step "
            f"would cost about ${next_usd:.4f} more"
        )
        self.spent_usd = spent_usd
        self.limit_usd = limit_usd
        self.next_usd = next_usd


class PurposeTotal(BaseModel):
    """What the calls of one purpose on one model used and cost."""

    model_config = ConfigDict(frozen=True)

    purpose: str
    model: str
    calls: int
    usage: Usage
    cost_usd: float


def prior_cost(purpose: str, model: str, prices: Mapping[str, ModelPrice] | None = None) -> float:
    tokens_in, tokens_out = PRIOR_TOKENS.get(purpose, PRIOR_TOKENS["reply"])
    return cost_usd(model, Usage(input_tokens=tokens_in, output_tokens=tokens_out), prices)


class SpendMeter(ForwardingLLM):
    """An `LLMClient` that passes every call through and prices what it used."""

    def __init__(
        self,
        inner: LLMClient,
        *,
        prices: Mapping[str, ModelPrice] | None = None,
        max_usd: float | None = None,
        on_call: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(inner)
        self.prices: Mapping[str, ModelPrice] = prices or {}
        self.max_usd = max_usd
        self.on_call = on_call
        self.calls = 0
        self.spent_usd = 0.0
        self.usage = Usage()
        self._totals: dict[tuple[str, str], PurposeTotal] = {}
        # Purpose -> the dearest call of that purpose so far (one model per purpose).
        self._dearest: dict[str, float] = {}

    # ------------------------------------------------------------------ guard
    def estimate(self, purpose: str, model: str) -> float:
        seen = self._dearest.get(purpose)
        if seen is not None:
            return seen * ESTIMATE_MARGIN
        return prior_cost(purpose, model, self.prices)

    def ensure_room(self, plan: Sequence[PlannedCall]) -> None:
        """Raise `SpendLimitReached` if the step `plan` describes would pass the limit."""
        if self.max_usd is None:
            return
        upcoming = sum(self.estimate(purpose, model) for purpose, model in plan)
        if self.spent_usd + upcoming > self.max_usd:
            raise SpendLimitReached(self.spent_usd, self.max_usd, upcoming)

    def totals(self) -> list[PurposeTotal]:
        return sorted(self._totals.values(), key=lambda t: (t.purpose, t.model))

    # ------------------------------------------------------------------ LLMClient
    async def _after(self, purpose: str, result: TextResult | ToolResult) -> None:
        self._count(purpose, result.model, result.usage)

    def _count(self, purpose: str, model: str, usage: Usage) -> None:
        cost = cost_usd(model, usage, self.prices)
        self.calls += 1
        self.spent_usd += cost
        self.usage = self.usage + usage
        self._dearest[purpose] = max(self._dearest.get(purpose, 0.0), cost)
        key = (purpose, model)
        before = self._totals.get(key)
        self._totals[key] = PurposeTotal(
            purpose=purpose,
            model=model,
            calls=(before.calls if before else 0) + 1,
            usage=(before.usage if before else Usage()) + usage,
            cost_usd=(before.cost_usd if before else 0.0) + cost,
        )
        log.info("%s call on %s: %s, $%.5f", purpose, model, usage, cost)
        if self.on_call is not None:
            self.on_call()
