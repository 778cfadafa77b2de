"""The loopback Anthropic fake as a separate process, for benchmarks.

Running it outside the benchmark's process keeps its event loop and CPU from being
counted as ours. Prints its base URL on the first line of stdout, then serves until
stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tests.fakes.anthropic_server import AnthropicFake


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per response")
    args = parser.parse_args()
    async with AnthropicFake(latency=args.latency) as server:
        print(server.base_url, flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin


if __name__ == "__main__":
    asyncio.run(main())
