"""Produce the example timeline of docs/using.md with the project's own command.

    .venv/bin/python -m tests.integration.timeline_example docs/timeline-example.png

Why it exists: the picture in the docs is `/sonality timeline` run on the scripted
community of `timeline_scenario` (the real runtime, the loopback model server and its
rule-based brain, no real model), so anyone can redo it after a change and see that it
is the same community the tests check.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from app.wiring import open_runtime
from tests.fakes.anthropic_fixtures import FAKE_API_KEY, client_for
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import command, make_settings
from tests.integration.timeline_scenario import COMMUNITY, play


async def example(out: Path) -> int:
    async with AnthropicFake(api_key=FAKE_API_KEY) as server:
        llm = client_for(server)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                settings = make_settings(Path(tmp) / "data", llm=llm)
                async with open_runtime(settings, llm=llm) as runtime:
                    await play(runtime, server.brain)
                    result = await command(runtime, "timeline", community=COMMUNITY)
        finally:
            await llm.aclose()
    if not result.files:
        print(result.text, file=sys.stderr)
        return 1
    await asyncio.to_thread(out.write_bytes, result.files[0].data)
    print(f"{out}: {len(result.files[0].data):,} bytes. {result.text}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.integration.timeline_example OUT.png")
    sys.exit(asyncio.run(example(Path(sys.argv[1]))))
