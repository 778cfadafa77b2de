"""`python -m app evaluate` as an operator runs it: a real process, settings from the
environment, the Anthropic fake (playing the principled stand-in) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from evaluate.report import METRICS, EvalReport
from evaluate.suites import SUITES
from tests.checkout import importing_this_checkout
from tests.evaluate.conftest import message_requests, provider_env
from tests.evaluate.standins import StandIn
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.test_process import MODEL_CACHE


def operator_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "OPENAI_", "DISCORD_", "SLACK_", "SONALITY_"))
    }
    env.update(
        SONALITY_DATA_DIR=str(data_dir),
        SONALITY_MODEL_CACHE_DIR=str(MODEL_CACHE),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return importing_this_checkout(env)


def test_help_explains_every_option_suite_metric_and_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "app", "evaluate", "--help"],
        cwd=tmp_path,
        env=operator_env(tmp_path / "data"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for option in ("--suite", "--yes", "--max-usd", "--out", "--label", "--min", "--max"):
        assert option in proc.stdout, option
    for word in ("--limit", "--compare", "exit codes", "model-judged", *SUITES, *METRICS):
        assert word in proc.stdout, word
    listing = subprocess.run(
        [sys.executable, "-m", "app", "--help"],
        cwd=tmp_path,
        env=operator_env(tmp_path / "data"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 0 and "evaluate" in listing.stdout
    assert not (tmp_path / "data").exists()


async def test_a_run_from_the_environment_leaves_the_data_dir_alone(tmp_path: Path) -> None:
    async with AnthropicFake(api_key=FAKE_API_KEY) as server:
        server.brain = StandIn(policy="principled")
        out_dir = tmp_path / "reports"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "evaluate",
            "--suite",
            "calibration,memory",
            "--limit",
            "1",
            "--yes",
            "--out",
            str(out_dir),
            "--max",
            "endorsement_rate=0",
            cwd=tmp_path,
            env=operator_env(tmp_path / "data", **provider_env(server)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, stderr.decode()
        report = EvalReport.read(out_dir / "report.json")
        assert report.complete and report.suites == ["calibration", "memory"]
        assert report.base_url == server.base_url
        assert report.calls == len(message_requests(server)) == 8 + 5 * 2 + 1
        assert report.memory is not None and report.memory.endorsement_rate_model_judged == 0
        assert "Thresholds met: 1 of 1." in stdout.decode()
        assert (out_dir / "evaluate.log").stat().st_size > 0
        assert not (tmp_path / "data").exists(), "the operator's data dir was touched"
