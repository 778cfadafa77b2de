"""A loopback LLM fake (Anthropic's, or OpenAI's with --vendor openai) as a separate
process, for benchmarks.

Running it outside the benchmark's process keeps its event loop and CPU from being
counted as ours. Prints its base URL on the first line of stdout, then serves until
stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tests.fakes.anthropic_server import AnthropicFake
from tests.fakes.openai_server import OpenAIFake


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per response")
    parser.add_argument("--vendor", choices=("anthropic", "openai"), default="anthropic")
    parser.add_argument(
        "--first-token", type=float, default=0.0, help="a stream's seconds to its first token"
    )
    parser.add_argument(
        "--tokens-per-second", type=float, default=0.0, help="a stream's rate after that"
    )
    args = parser.parse_args()
    fake = OpenAIFake if args.vendor == "openai" else AnthropicFake
    async with fake(latency=args.latency) as server:
        server.first_token_seconds = args.first_token
        server.tokens_per_second = args.tokens_per_second
        print(server.base_url, flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin


if __name__ == "__main__":
    asyncio.run(main())
