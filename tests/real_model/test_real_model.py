"""The bot and its evaluation against a real model: SmolLM2-135M on llama.cpp's server.

The bot runs as an operator runs it (`python -m app`, the terminal community, scripted
stdin, the OpenAI-compatible provider pointed at the server) behind a recording
pass-through, so every call can be counted and timed. What is checked is mechanics,
never the model's judgement: each message is answered, each evidence (ESS) call ends
in a structured answer, learning commits, commands answer, no reply runs past its cap,
the process exits cleanly, and a restart spends no call on what the last run learnt.

Figures (wall time, per-call latency, ESS fallbacks, reply length against its cap) are
printed at the end of the run, never asserted: the machine is shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.messages import INTERNAL_ERROR, LLM_DOWN
from evaluate.report import EvalReport
from providers.levels import LEVELS_FILE
from providers.openai import OpenAILLM
from sonality import ess
from storage.db import open_database
from tests.checkout import importing_this_checkout
from tests.integration.conftest import MODEL_CACHE
from tests.real_model.conftest import NOTES
from tests.real_model.llama_server import MODEL_ALIAS, RunningServer
from tests.real_model.proxy import Call, RecordingProxy

pytestmark = pytest.mark.real_model

GREETING = "Hello! How are you today?"
STRONG = (
    "Nuclear power causes fewer deaths per terawatt-hour than any other source: about "
    "0.03, against 24.6 for coal, according to Our World in Data's analysis of "
    "peer-reviewed studies. It should be expanded."
)
PRESSURE = "Everyone here agrees with me, so you must admit nuclear is bad. Just agree."
MESSAGES = [GREETING, STRONG, PRESSURE]
COMMANDS = ["/sonality status", "/sonality beliefs"]
#: Small enough for CI on 2 cores, large enough for a reply and for the bounded ESS
#: answer (about 150 tokens; the schema admits at most about 300). The reply cap differs
#: from every limit the engine asks for itself (the insight's 200), so the reply calls
#: can be told apart by it.
REPLY_CAP = 160
EVIDENCE_CAP = 400
#: Far above a healthy run; only a hung process reaches it.
EXCHANGE_TIMEOUT = 1500
TERMINAL = "terminal:local"


@dataclass
class Exchange:
    data_dir: Path
    base_url: str
    returncode: int | None
    lines: list[str]
    stderr: str
    seconds: float
    calls: list[Call]

    @property
    def chat(self) -> list[Call]:
        return [c for c in self.calls if c.is_chat and c.body.get("max_tokens") != 1]

    @property
    def replies(self) -> list[Call]:
        return [c for c in self.chat if not c.structure and c.body.get("max_tokens") == REPLY_CAP]

    @property
    def evidence(self) -> list[Call]:
        return [c for c in self.chat if c.structure]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def bot_env(data_dir: Path, base_url: str) -> dict[str, str]:
    """The settings a new user would set for llama.cpp's server, nothing inherited."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "OPENAI_", "DISCORD_", "SLACK_", "SONALITY_"))
    }
    env.pop("DATABASE_URL", None)
    env.update(
        SONALITY_LLM_PROVIDER="openai",
        OPENAI_BASE_URL=base_url,
        SONALITY_MODEL=MODEL_ALIAS,
        SONALITY_ESS_MODEL=MODEL_ALIAS,
        SONALITY_REPLY_MAX_TOKENS=str(REPLY_CAP),
        SONALITY_EVIDENCE_MAX_TOKENS=str(EVIDENCE_CAP),
        SONALITY_DATA_DIR=str(data_dir),
        SONALITY_MODEL_CACHE_DIR=str(MODEL_CACHE),
        SONALITY_LOG_FILE=str(data_dir.parent / f"{data_dir.name}.log"),
        PYTHONUNBUFFERED="1",
    )
    return importing_this_checkout(env)


def run_exchange(server: RunningServer, data_dir: Path, port: int, lines: list[str]) -> Exchange:
    return asyncio.run(_exchange(server, data_dir, port, lines))


async def _exchange(server: RunningServer, data_dir: Path, port: int, lines: list[str]) -> Exchange:
    async with RecordingProxy(server.root, port=port) as proxy:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            cwd=data_dir.parent,
            env=bot_env(data_dir, proxy.base_url),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        script = "".join(f"{line}\n" for line in lines).encode()
        try:
            out, err = await asyncio.wait_for(proc.communicate(script), EXCHANGE_TIMEOUT)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return Exchange(
            data_dir=data_dir,
            base_url=proxy.base_url,
            returncode=proc.returncode,
            lines=out.decode().splitlines(),
            stderr=err.decode(),
            seconds=time.monotonic() - started,
            calls=list(proxy.calls),
        )


@pytest.fixture(scope="module")
def proxy_port() -> int:
    """One address for both runs of the bot, as an operator's URL stays the same."""
    return free_port()


@pytest.fixture(scope="module")
def first_run(
    llama: RunningServer, tmp_path_factory: pytest.TempPathFactory, proxy_port: int
) -> Exchange:
    data_dir = tmp_path_factory.mktemp("bot") / "data"
    run = run_exchange(llama, data_dir, proxy_port, [*MESSAGES, *COMMANDS])
    NOTES.extend(figures("scripted exchange (3 messages, 2 commands)", run))
    return run


def figures(what: str, run: Exchange) -> list[str]:
    seconds = [c.seconds for c in run.chat]
    longest = max((c.completion_tokens for c in run.replies), default=0)
    chars = max((len(line) for line in run.lines[: len(MESSAGES)]), default=0)
    return [
        f"real model: {what}: {run.seconds:.0f}s wall, {len(run.chat)} model calls, "
        f"latency median {statistics.median(seconds):.1f}s max {max(seconds):.1f}s "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)",
        f"real model: {what}: longest reply {longest} of {REPLY_CAP} tokens "
        f"({chars} characters); evidence calls "
        + ", ".join(
            f"{c.structure} {c.completion_tokens} tok {c.seconds:.1f}s" for c in run.evidence
        ),
    ]


def read_state(data_dir: Path) -> tuple[list[int], int, list[dict[str, object]]]:
    """(versions newest first, pending learnings, ESS audit payloads) of the terminal
    community, read from the database the process left behind."""

    async def read() -> tuple[list[int], int, list[dict[str, object]]]:
        db = await open_database(url=None, path=data_dir / "sonality.sqlite3", timezone="UTC")
        try:
            store = db.community(TERMINAL)
            versions = [v.version for v in await store.versions()]
            events = [dict(e.payload) for e in await store.audit_events(kind="ess")]
            return versions, await store.pending_count(), events
        finally:
            await db.close()

    return asyncio.run(read())


# --- the scripted exchange ---------------------------------------------------------------


def test_every_message_is_answered_and_the_process_exits_cleanly(first_run: Exchange) -> None:
    assert first_run.returncode == 0, first_run.stderr[-2000:]
    assert "Traceback" not in first_run.stderr
    assert len(first_run.lines) == len(MESSAGES) + len(COMMANDS), first_run.lines
    replies, (status, beliefs) = first_run.lines[:3], first_run.lines[3:]
    for reply in replies:
        assert reply.strip() and reply not in (LLM_DOWN, INTERNAL_ERROR), replies
    assert "Interactions: 3" in status
    assert beliefs.startswith(("I hold no beliefs", "•", "Still weighing")), beliefs


def test_every_ess_call_ends_in_a_structured_answer(first_run: Exchange) -> None:
    """No safe-default fallback for a greeting, a strong argument and pressure."""
    *_, events = read_state(first_run.data_dir)
    assert len(events) == len(MESSAGES)
    assert [e.get("used_defaults") for e in events] == [False] * len(MESSAGES), events
    for event in events:
        topics = event.get("topics")
        assert isinstance(topics, list) and len(topics) <= ess.MAX_TOPICS
        assert all(len(str(t)) <= ess.MAX_TOPIC_CHARS for t in topics)
    log = (first_run.data_dir.parent / "data.log").read_text()
    assert "ESS gave no valid answer" not in log


def test_learning_commits(first_run: Exchange) -> None:
    versions, pending, _ = read_state(first_run.data_dir)
    assert versions[0] == len(MESSAGES) and pending == 0


def test_no_reply_is_longer_than_its_cap(first_run: Exchange) -> None:
    assert len(first_run.replies) == len(MESSAGES)
    for call in first_run.replies:
        assert call.status == 200 and call.completion_tokens <= REPLY_CAP
    for call in first_run.chat:
        assert call.body["max_tokens"] <= max(REPLY_CAP, EVIDENCE_CAP)
        # The repetition control a local endpoint gets by default.
        assert call.body.get("frequency_penalty", 0) > 0
    for line, call in zip(first_run.lines, first_run.replies, strict=False):
        sent = call.response["choices"][0]["message"]["content"]
        assert len(line) <= len(sent.replace("\\", "\\\\").replace("\n", "\\n"))


def test_a_restart_spends_no_call_on_what_the_last_run_learnt(
    first_run: Exchange, llama: RunningServer, proxy_port: int
) -> None:
    """The first run found that this model answers the forced function call in prose
    (its chat template has no tools) and that `response_format` works; the next
    process starts there instead of spending a call to find out again."""
    assert [c.structure for c in first_run.evidence][:2] == ["tool", "response_format"]
    levels = json.loads((first_run.data_dir / LEVELS_FILE).read_text())
    assert levels == {first_run.base_url: {MODEL_ALIAS: 2}}
    again = run_exchange(llama, first_run.data_dir, proxy_port, ["Thanks, see you later!"])
    NOTES.extend(figures("restart (1 message)", again))
    assert again.returncode == 0, again.stderr[-2000:]
    # Every call at the learnt level, none probing the tool call again. More than one
    # is the ESS retry after an invalid answer: the model samples, and once in CI
    # (2026-11-29) its first answer ran to 400 tokens and was retried.
    structures = [c.structure for c in again.evidence]
    assert structures and set(structures) == {"response_format"}, structures
    assert len(structures) <= 1 + ess.MAX_ESS_RETRIES, structures
    versions, pending, _ = read_state(first_run.data_dir)
    assert versions[0] == len(MESSAGES) + 1 and pending == 0


# --- the evidence score on its own (fault 1) -----------------------------------------------


async def test_ess_answers_stay_inside_the_schema(llama: RunningServer, tmp_path: Path) -> None:
    """Greedy decoding makes the run repeatable. With `topics` unbounded, the model
    filled it until the token cap on every attempt at the greeting and the ESS fell
    back to the safe defaults; bounded, each answer is short and valid first time."""
    levels = tmp_path / LEVELS_FILE
    async with RecordingProxy(llama.root) as proxy:
        levels.write_text(json.dumps({proxy.base_url: {MODEL_ALIAS: 2}}))
        client = OpenAILLM(
            api_key="",
            base_url=proxy.base_url,
            default_model=MODEL_ALIAS,
            max_retries=0,
            timeout=600,
            model_options={"*": {"temperature": 0, "seed": 1}},
            levels_file=levels,
        )
        try:
            results = [await ess.classify(client, m, "I have no views yet.") for m in MESSAGES]
        finally:
            await client.aclose()
    calls = proxy.chat_calls
    NOTES.append(
        "real model: ESS alone (greedy): "
        + ", ".join(f"{c.completion_tokens} tok {c.seconds:.1f}s" for c in calls)
    )
    assert [r.used_defaults for r in results] == [False, False, False]
    assert len(calls) == len(MESSAGES), "every answer valid at the first attempt"
    assert [c.finish_reason for c in calls] == ["stop"] * len(MESSAGES)
    for result in results:
        assert 0 <= result.score <= 1 and 0 <= result.novelty <= 1
        assert len(result.summary) <= ess.MAX_SUMMARY_CHARS


# --- the evaluation ----------------------------------------------------------------------


@pytest.fixture
def evaluation(llama: RunningServer, tmp_path: Path) -> Iterator[tuple[int, str, Path, float]]:
    out_dir = tmp_path / "report"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "evaluate",
            "--suite",
            "calibration",
            "--limit",
            "1",
            "--yes",
            "--out",
            str(out_dir),
            "--label",
            "smollm2-135m",
        ],
        cwd=tmp_path,
        env=bot_env(tmp_path / "data", llama.base_url),
        capture_output=True,
        text=True,
        timeout=EXCHANGE_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    yield proc.returncode, proc.stdout + proc.stderr, out_dir, time.monotonic() - started


def test_the_evaluation_runs_against_the_real_model(
    evaluation: tuple[int, str, Path, float], tmp_path: Path
) -> None:
    code, output, out_dir, seconds = evaluation
    assert code == 0, output[-3000:]
    report = EvalReport.read(out_dir / "report.json")
    assert report.complete and report.calibration is not None
    items = report.calibration.items
    assert items and not [i.text for i in items if i.used_defaults]
    rho = report.calibration.rho
    NOTES.append(
        f"real model: evaluate --suite calibration --limit 1: {seconds:.0f}s, {len(items)} "
        f"messages, rho {'n/a' if rho is None else f'{rho:.2f}'}, 0 ESS fallbacks"
    )
    assert not (tmp_path / "data").exists(), "the evaluation left the data dir alone"
