"""Figure 10: a member's share of the daily limit, against one member flooding.

Workload: a community with a $1 daily limit at list prices (the default models, priced
by `providers.pricing`; the loopback fake applies Anthropic's caching rules). One
member, Mallory, sends long messages (4,000 characters, the most the bot reads) on
which she argues (ESS and insight calls), each answered at length (about 1,000 output
tokens); the messages go in as fast as the bot answers, which at the flood limit
(6 a minute) would be one every 10 s. Then three other members each send short
messages until nothing more is answered.

Printed: after how many of Mallory's messages (and so how many minutes at the flood
limit) she was stopped, what she had spent, and what share of the limit was left for
everyone else, with the member share at its default (half) and turned off (the
behaviour before it existed: Mallory spends the whole day). Through the real runtime
and storage; not a timed test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cost import KEY, _runtime
from bot.messages import Community, IncomingMessage, ReplyKind, User
from bot.runtime import Runtime
from tests.fakes.anthropic_server import AnthropicFake

COMMUNITY = Community(id="bench:share", name="share")
MALLORY = User(id="mallory", name="Mallory")
OTHERS = [User(id=f"member-{i}", name=name) for i, name in enumerate(("Ana", "Ben", "Cai"))]
LIMIT_USD = 1.0
FLOOD_PER_MINUTE = 6  # SONALITY_RATE_LIMIT_MESSAGES' default, per 60 s
ARGUMENT = (
    "A 2024 field study of 16,000 call-centre staff found remote work raised output by "
    "13% with fewer sick days, measured over nine months against an office control "
    "group, and the effect held after controlling for tenure and team. "
)
LONG_MESSAGE = (ARGUMENT * 40)[:4000]
LONG_REPLY = " ".join(["That is a long and careful answer to a long message."] * 100)
MAX_MESSAGES = 200

Report = Callable[..., None]


@dataclass(frozen=True)
class Flood:
    share: float
    answered: int  # Mallory's messages answered before she was stopped
    mallory_usd: float  # what she spent, her learning included
    others_answered: int
    community_usd: float  # spent when nothing more was answered

    @property
    def left_after_mallory(self) -> float:
        return max(0.0, LIMIT_USD - self.mallory_usd) / LIMIT_USD


async def _send(runtime: Runtime, user: User, text: str) -> bool:
    """Whether the message was answered (not a notice, not silence)."""
    reply = await runtime.handle(
        IncomingMessage(community=COMMUNITY, channel_id="c", user=user, text=text)
    )
    return reply is not None and reply.kind is ReplyKind.ANSWER


async def flood(work: Path, share: float) -> Flood:
    async with AnthropicFake(api_key=KEY) as server:
        server.brain.ess_rule(
            contains="field study",
            score=0.75,
            direction="supports",
            topics=["remote_work"],
            novelty=0.7,
            reasoning_type="empirical_data",
            source_reliability="peer_reviewed",
        )
        server.brain.reply_rule(contains="<personality_state>", text=LONG_REPLY, in_system=True)
        extra: dict[str, Any] = {
            "SONALITY_DAILY_BUDGET_USD": LIMIT_USD,
            "SONALITY_MEMBER_BUDGET_SHARE": share,
        }
        async with _runtime(work / f"share-{share}", server, **extra) as (runtime, _):
            answered = 0
            while answered < MAX_MESSAGES and await _send(runtime, MALLORY, LONG_MESSAGE):
                answered += 1
            await runtime.drain()  # her answered messages are still learned, and count
            spent = await runtime.budget.member_spent(COMMUNITY.id)
            mallory = spent.get(MALLORY.id, 0.0)
            others = 0
            while others < MAX_MESSAGES:
                member = OTHERS[others % len(OTHERS)]
                if not await _send(runtime, member, f"What do you make of that, {others}?"):
                    break
                others += 1
            status = await runtime.budget.status(COMMUNITY.id)
            # No limit, so learning the limit held back finishes before the runtime closes.
            await runtime.budget.set_limit(COMMUNITY.id, None, set_by="bench")
            agent = runtime.registry.get(COMMUNITY.id)
            if agent is not None:
                agent.resume_learning()
            await runtime.drain()
            return Flood(share, answered, mallory, others, status.spent_usd)


async def figure_share(work: Path, report: Report) -> None:
    shared, unshared = await flood(work, 0.5), await flood(work, 1.0)
    workload = (
        f"${LIMIT_USD:g} daily limit at list prices, one member flooding 4,000-character "
        f"arguments answered at ~1,000 tokens, then 3 members chatting"
    )
    for figures, label in ((shared, "share 0.5, the default"), (unshared, "share off")):
        minutes = figures.answered / FLOOD_PER_MINUTE
        report(
            f"10. one member's flood ({label})",
            f"stopped after {figures.answered} messages ({minutes:.1f} min at the flood "
            f"limit), having spent {figures.mallory_usd / LIMIT_USD:.0%} of the limit; "
            f"{figures.left_after_mallory:.0%} left for the others, who then got "
            f"{figures.others_answered} replies",
            workload,
            "others keep ≥ 40% of the limit" if figures.share < 1 else "none (before the rule)",
            figures.left_after_mallory >= 0.4 if figures.share < 1 else None,
        )


if __name__ == "__main__":  # a quick look: python -m bench.share
    import asyncio
    import tempfile

    def _print(name: str, value: str, workload: str, target: str, ok: bool | None = None) -> None:
        print(f"{name}: {value}  ({workload}; target {target})  ok={ok}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(figure_share(Path(tmp), _print))
