"""What a call costs: a price table per model, overridable from settings.

Why a table in code: spending limits and `/sonality usage` must work offline, the
moment the bot starts. The defaults are the vendors' published list prices (Anthropic's
and OpenAI's pricing pages, read 2026-11) in US dollars per million tokens; an operator
whose contract or model differs sets `SONALITY_PRICES`. A model the table does not know
(a local Ollama model, say) costs 0: it runs on the operator's own hardware.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from sonality.llm import Usage

log = logging.getLogger(__name__)

#: Anthropic bills a 5-minute cache write at 1.25x and a cache read at 0.1x the input
#: price; OpenAI bills no write surcharge and reads at the price in the table.
ANTHROPIC_CACHE_WRITE_FACTOR = 1.25
ANTHROPIC_CACHE_READ_FACTOR = 0.1


class ModelPrice(BaseModel):
    """US dollars per million tokens. Cache prices left out follow the input price by
    Anthropic's rule (write 1.25x, read 0.1x)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float | None = Field(default=None, ge=0)
    cache_read: float | None = Field(default=None, ge=0)

    def cost_usd(self, usage: Usage) -> float:
        write = self.cache_write
        read = self.cache_read
        if write is None:
            write = self.input * ANTHROPIC_CACHE_WRITE_FACTOR
        if read is None:
            read = self.input * ANTHROPIC_CACHE_READ_FACTOR
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_write_tokens * write
            + usage.cache_read_tokens * read
        ) / 1_000_000


FREE = ModelPrice(input=0, output=0, cache_write=0, cache_read=0)


def _openai(input: float, output: float, cached: float) -> ModelPrice:
    return ModelPrice(input=input, output=output, cache_write=input, cache_read=cached)


#: Keys are model-id prefixes: "claude-haiku-4-5" also prices "claude-haiku-4-5-20251001".
PRICES: dict[str, ModelPrice] = {
    # Anthropic
    "claude-opus-4-6": ModelPrice(input=5, output=25),
    "claude-opus-4-5": ModelPrice(input=5, output=25),
    "claude-opus-4-1": ModelPrice(input=15, output=75),
    "claude-opus-4": ModelPrice(input=15, output=75),
    "claude-sonnet-4-6": ModelPrice(input=3, output=15),
    "claude-sonnet-4-5": ModelPrice(input=3, output=15),
    "claude-sonnet-4": ModelPrice(input=3, output=15),
    "claude-3-7-sonnet": ModelPrice(input=3, output=15),
    "claude-haiku-4-5": ModelPrice(input=1, output=5),
    "claude-3-5-haiku": ModelPrice(input=0.8, output=4),
    "claude-3-haiku": ModelPrice(input=0.25, output=1.25),
    # OpenAI
    "gpt-5-nano": _openai(0.05, 0.40, 0.005),
    "gpt-5-mini": _openai(0.25, 2.00, 0.025),
    "gpt-5": _openai(1.25, 10.00, 0.125),
    "gpt-4.1-nano": _openai(0.10, 0.40, 0.025),
    "gpt-4.1-mini": _openai(0.40, 1.60, 0.10),
    "gpt-4.1": _openai(2.00, 8.00, 0.50),
    "gpt-4o-mini": _openai(0.15, 0.60, 0.075),
    "gpt-4o": _openai(2.50, 10.00, 1.25),
}

_warned: set[str] = set()


def _canonical(model: str) -> str:
    """OpenRouter spells models "vendor/name" and Anthropic's with dots ("claude-sonnet-4.5")."""
    name = model.rsplit("/", 1)[-1].strip().lower()
    return name.replace(".", "-") if name.startswith("claude") else name


def price_for(model: str, overrides: Mapping[str, ModelPrice] | None = None) -> ModelPrice:
    """The price of `model`: an exact override, else the longest matching table prefix,
    else free (logged once per model, so an operator sees a missing price)."""
    if overrides and model in overrides:
        return overrides[model]
    name = _canonical(model)
    if overrides:
        for key, price in overrides.items():
            if _canonical(key) == name:
                return price
    best = max((key for key in PRICES if name.startswith(key)), key=len, default=None)
    if best is not None:
        return PRICES[best]
    if model not in _warned:
        _warned.add(model)
        log.info("no price known for model %s: counted as free (set SONALITY_PRICES)", model)
    return FREE


def cost_usd(model: str, usage: Usage, overrides: Mapping[str, ModelPrice] | None = None) -> float:
    return price_for(model, overrides).cost_usd(usage)
