"""A forget-me killed with SIGKILL at a chosen step is finished on the next start and
never leaves the member half-forgotten (issue 11). A real subprocess runs the forget-me
on the real SQLite file and kills itself through the test hook right before the step."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
from pathlib import Path

import pytest

from bot.forget_me import KILL_HOOK, resume_forgets
from sonality.agent import SonalityAgent
from sonality.replay import replay
from storage import Database
from tests.engine import test_replay as harness
from tests.engine.test_agent_learning import RecordingMemory, ScriptedLLM
from tests.engine.test_replay import ALICE, BOB, script
from tests.integration.test_forget_core import TOKEN, file_bytes, run, with_token

COMMUNITY = "test:crash"
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import asyncio, sys
from bot.forget_me import forget_member
from sonality.agent import SonalityAgent
from storage import Database
from tests.engine.test_agent_learning import RecordingMemory, ScriptedLLM
from tests.engine.test_replay import TUNABLES

async def main(path):
    db = await Database.open(path)
    agent = await SonalityAgent.load(
        client=ScriptedLLM(), store=db.community(%(community)r), episodes=RecordingMemory(),
        model="m", ess_model="m", config=TUNABLES,
    )
    await forget_member(db, agent, %(community)r, %(member)r, requested_by="self")

asyncio.run(main(sys.argv[1]))
"""


async def load(db: Database) -> SonalityAgent:
    return await SonalityAgent.load(
        client=ScriptedLLM(),
        store=db.community(COMMUNITY),
        episodes=RecordingMemory(),
        model="m",
        ess_model="m",
        config=harness.TUNABLES,
    )


@pytest.mark.parametrize("step", [2, 3])
async def test_a_forget_me_killed_mid_way_completes_on_the_next_start(tmp_path: Path, step: int):
    path = tmp_path / "bot.sqlite3"
    db = await Database.open(path)
    agent = await load(db)
    llm = agent.client
    assert isinstance(llm, ScriptedLLM)
    await run(agent, llm, with_token(script(6, 30)))
    log = await db.community(COMMUNITY).evidence()
    expected = replay(log, without_members={ALICE.id}, config=harness.TUNABLES)
    versions_before = agent.sponge.version
    bob_rows = await db.member_interaction_ids(COMMUNITY, BOB.id)
    await agent.close(grace_seconds=5)
    await db.close()

    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD % {"community": COMMUNITY, "member": ALICE.id},
        str(path),
        cwd=ROOT,
        env={**os.environ, KILL_HOOK: str(step)},
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(child.communicate(), 120)
    assert child.returncode == -signal.SIGKILL, stderr.decode()[-2000:]

    db = await Database.open(path)
    try:
        # Killed mid-way: the journal says so, and her messages are all still there
        # (nothing was deleted before the one erasing transaction).
        [pending] = await db.open_forgets()
        assert pending.member_id == ALICE.id
        assert await db.member_interaction_ids(COMMUNITY, ALICE.id)
        [latest] = await db.community(COMMUNITY).versions(limit=1)
        assert (latest.cause == "forget-me") is (step == 3)  # killed before or after it
        agents: dict[str, SonalityAgent] = {}

        async def agent_for(community_id: str) -> SonalityAgent:
            agents[community_id] = agents.get(community_id) or await load(db)
            return agents[community_id]

        [done] = await resume_forgets(db, agent_for)
        assert await db.open_forgets() == []
        restarted = agents[COMMUNITY]
        store = db.community(COMMUNITY)
        versions = await store.versions(limit=5)
        # Exactly one forget-me version, whether or not it was committed before the kill.
        assert [v.cause for v in versions].count("forget-me") == 1
        assert versions[0].version == versions_before + 1 == done.version
        for topic, value in expected.opinion_vectors.items():
            assert math.isclose(restarted.sponge.opinion_vectors[topic], value, abs_tol=1e-9)
        assert set(restarted.sponge.opinion_vectors) == set(expected.opinion_vectors)
        assert await db.member_interaction_ids(COMMUNITY, ALICE.id) == []
        assert await db.member_interaction_ids(COMMUNITY, BOB.id) == bob_rows
        await restarted.close(grace_seconds=5)
    finally:
        await db.close()
    raw = file_bytes(path)
    assert TOKEN.encode() not in raw and ALICE.id.encode() not in raw
