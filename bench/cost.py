"""Figure 5: what a message costs, against the loopback fake that applies Anthropic's
prompt-caching rules (minimum prefix per model, identical prefixes only).

Workload: 60 messages from 4 members taking turns, each member's 15 a mix of casual
chat, arguments with evidence and social pressure, through the real runtime (buffers,
memories, ESS, insights, reflections every 20 interactions). Every LLM call's tokens
are priced with `providers.pricing`; the figures are

* prompt tokens per message (all calls, cached or not),
* the share of prompt tokens read from the cache,
* cost per message ÷ the cost of the reply call alone without caching (target ≤ 1.3),
* cost per message in Sonnet-input-token equivalents (target ≤ 1,500): a Sonnet input
  token is 1, output 5, cache write 1.25, cache read 0.1, and a Haiku token a third.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.wiring import open_runtime
from bot.messages import Community, IncomingMessage, User
from bot.settings import Settings
from providers.anthropic import AnthropicLLM
from providers.forwarding import ForwardingLLM
from providers.pricing import cost_usd, price_for
from sonality.llm import LLMClient, TextResult, ToolResult, Usage
from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_server import OpenAIFake

if TYPE_CHECKING:
    from providers.openai import OpenAILLM

KEY = "sk-bench"
MODEL_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-models"
SONNET_INPUT_USD = price_for("claude-sonnet-4-6").input / 1_000_000

ARGUMENTS = [
    (
        "study",
        "remote_work",
        "A 2024 study of 16,000 call-centre staff found remote work raised output by 13% "
        "with fewer sick days, measured over nine months against an office control group.",
    ),
    (
        "trial",
        "protected_bike_lanes",
        "A five-city trial logged injuries before and after protected bike lanes went in: "
        "serious crashes fell by 44% on the treated streets and stayed flat elsewhere.",
    ),
    (
        "meta-analysis",
        "spaced_repetition",
        "A meta-analysis of 254 experiments found spaced repetition beats massed practice "
        "for retention after a week, with an average effect size of 0.6.",
    ),
]
PRESSURE = [
    "Everyone knows remote work is a disaster, just admit it.",
    "Come on, nobody serious believes bike lanes help. Everyone agrees they don't.",
    "Everybody in this server thinks flashcards are a waste of time. Give it up.",
]
CHAT = [
    "Hey, how's it going today?",
    "What's a good book you'd recommend for a long train ride?",
    "Haha fair enough. What do you think makes a conversation interesting?",
    "I'm making pasta tonight, any tips?",
    "Thanks, that's helpful!",
    "Do you like puzzles?",
]
# A reply of about 100 tokens: closer to a real chat answer than the fake's echo.
REPLY = (
    "That's a fair question, and I'd rather give you my honest take than a safe one. "
    "From what I've seen, the answer depends on the details: who is asking, what they "
    "already tried, and what they count as success. If you tell me a little more about "
    "your situation, I can be more specific, and I'll say so plainly if I disagree."
)


def workload() -> list[tuple[int, str]]:
    """(member, text) in order: per member chat, argument, chat, pressure, chat, ..."""
    messages = []
    for i in range(60):
        member, turn = i % 4, i // 4
        kind = turn % 5
        if kind == 1:
            text = ARGUMENTS[(member + turn) % len(ARGUMENTS)][2]
        elif kind == 3:
            text = PRESSURE[(member + turn) % len(PRESSURE)]
        else:
            text = CHAT[(member + turn) % len(CHAT)]
        messages.append((member, text))
    return messages


def teach(server: AnthropicFake | OpenAIFake, long_replies: bool) -> None:
    for keyword, topic, _ in ARGUMENTS:
        server.brain.ess_rule(
            contains=keyword,
            score=0.75,
            direction="supports",
            topics=[topic],
            novelty=0.7,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
        )
    for keyword in ("everyone knows", "nobody serious", "everybody in this"):
        server.brain.ess_rule(
            contains=keyword,
            score=0.08,
            direction="opposes",
            topics=["social_pressure"],
            novelty=0.1,
            reasoning_type="social_pressure",
            source_reliability="not_applicable",
        )
    if long_replies:
        server.brain.reply_rule(contains="<personality_state>", text=REPLY, in_system=True)


@dataclass
class Call:
    purpose: str
    model: str
    usage: Usage


class UsageTap(ForwardingLLM):
    """Passes calls through and keeps each one's purpose, model and tokens."""

    def __init__(self, inner: LLMClient) -> None:
        super().__init__(inner)
        self.calls: list[Call] = []

    async def _after(self, purpose: str, result: TextResult | ToolResult) -> None:
        self.calls.append(Call(purpose, result.model, result.usage))


@dataclass(frozen=True)
class CostFigures:
    messages: int
    prompt_tokens_per_message: float
    cache_read_share: float
    reply_cache_read_share: float
    ratio: float
    sonnet_equivalents: float
    usd_per_message: float
    by_purpose: dict[str, float]


def summarise(calls: Sequence[Call], messages: int) -> CostFigures:
    def prompt(u: Usage) -> int:
        return u.input_tokens + u.cache_read_tokens + u.cache_write_tokens

    total_usd = sum(cost_usd(c.model, c.usage) for c in calls)
    replies = [c for c in calls if c.purpose == "reply"]
    uncached = sum(
        cost_usd(c.model, Usage(input_tokens=prompt(c.usage), output_tokens=c.usage.output_tokens))
        for c in replies
    )
    all_prompt = sum(prompt(c.usage) for c in calls)
    reply_prompt = sum(prompt(c.usage) for c in replies)
    by_purpose: dict[str, float] = {}
    for c in calls:
        by_purpose[c.purpose] = by_purpose.get(c.purpose, 0.0) + cost_usd(c.model, c.usage)
    return CostFigures(
        messages=messages,
        prompt_tokens_per_message=all_prompt / messages,
        cache_read_share=sum(c.usage.cache_read_tokens for c in calls) / max(all_prompt, 1),
        reply_cache_read_share=sum(c.usage.cache_read_tokens for c in replies)
        / max(reply_prompt, 1),
        ratio=total_usd / uncached if uncached else float("nan"),
        sonnet_equivalents=total_usd / SONNET_INPUT_USD / messages,
        usd_per_message=total_usd / messages,
        by_purpose={k: v / SONNET_INPUT_USD / messages for k, v in sorted(by_purpose.items())},
    )


@contextlib.asynccontextmanager
async def _runtime(
    data_dir: Path, server: AnthropicFake | OpenAIFake, **extra: Any
) -> AsyncIterator[Any]:
    openai = isinstance(server, OpenAIFake)
    values: dict[str, Any] = {
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": server.base_url,
        "OPENAI_API_KEY": KEY,
        "OPENAI_BASE_URL": server.base_url,
        "SONALITY_LLM_PROVIDER": "openai" if openai else "anthropic",
        "SONALITY_DATA_DIR": str(data_dir),
        "SONALITY_MODEL_CACHE_DIR": str(MODEL_CACHE),
        "SONALITY_RATE_LIMIT_MESSAGES": 1_000_000,
        "SONALITY_LLM_MAX_RETRIES": 0,
        **extra,
    }
    settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
    from providers.openai import OpenAILLM  # only when used: the SDK is 13 MB

    inner: AnthropicLLM | OpenAILLM = (
        OpenAILLM(
            api_key=KEY, base_url=server.base_url, max_retries=0, default_model=settings.model
        )
        if openai
        else AnthropicLLM(api_key=KEY, base_url=server.base_url, max_retries=0)
    )
    tap = UsageTap(inner)
    try:
        async with open_runtime(settings, llm=tap) as runtime:
            yield runtime, tap
    finally:
        await inner.aclose()


async def measure_cost(
    data_dir: Path, long_replies: bool = False, vendor: str = "anthropic", **extra: Any
) -> CostFigures:
    """Run the workload once; `extra` are settings (e.g. SONALITY_ESS_MODEL). Replies
    are the fake's short echo (about 50 tokens), or about 100 tokens with
    `long_replies`."""
    community = Community(id="bench:cost", name="cost")
    members = [
        User(id=f"member-{i}", name=name) for i, name in enumerate("Ana Ben Cai Dee".split())
    ]
    fake = OpenAIFake if vendor == "openai" else AnthropicFake
    async with fake(api_key=KEY) as server:
        teach(server, long_replies)
        async with _runtime(data_dir, server, **extra) as (runtime, tap):
            plan = workload()
            for member, text in plan:
                await runtime.handle(
                    IncomingMessage(
                        community=community, channel_id="c", user=members[member], text=text
                    )
                )
                await runtime.drain()
            return summarise(tap.calls, len(plan))


def describe(figures: CostFigures) -> str:
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in figures.by_purpose.items())
    return (
        f"{figures.ratio:.2f}× the bare reply call; {figures.sonnet_equivalents:,.0f} "
        f"Sonnet-input-token equivalents (${figures.usd_per_message:.4f}) per message "
        f"[{parts}]; {figures.prompt_tokens_per_message:,.0f} prompt tokens per message, "
        f"{figures.cache_read_share:.0%} read from the cache "
        f"({figures.reply_cache_read_share:.0%} of the reply calls')"
    )
