"""`python -m app` before the bot starts: settings, the command line, the data-dir lock.

Every refusal is checked the way a newcomer meets it: a real process, ONE line on
stderr naming the variable, exit code 2, no traceback, nothing written.
"""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from sonality.memory.freed_memory import SCRUBBING_TUNABLES
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_process import _start_bot, bot_env


def run_bot_process(
    tmp_path: Path, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=tmp_path,
        env=bot_env(tmp_path / "data", **env),
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
    )


def stderr_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("SONALITY_ESS_THRESHOLD", "abc", "between 0 and 1"),
        ("SONALITY_ESS_THRESHOLD", "5", "between 0 and 1"),
        ("SONALITY_ESS_THRESHOLD", "nan", "between 0 and 1"),
        ("SONALITY_REFLECTION_EVERY", "0", "at least 1"),
        ("SONALITY_TIMEZONE", "Mars/Olympus", "IANA time zone"),
        ("SONALITY_LOG_LEVEL", "verbose", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("SONALITY_DATA_DIR", "/proc/x", "cannot be created"),
        ("SONALITY_STRICT_SETTINGS", "maybe", "true or false"),
        ("SONALITY_LLM_PROVIDER", "gemini", "anthropic, openai"),
        ("SONALITY_NIGHTLY_TIME", "24:00", "HH:MM or HH:MM:SS"),
        ("SONALITY_NIGHTLY_TIME", "4pm", "HH:MM or HH:MM:SS"),
        ("SONALITY_ANSWER_BOTS", "123,@helper", "'@helper' is not a bot id"),
        ("SONALITY_BOT_EXCHANGES", "0", "between 1 and 100"),
        # "Forever" values: they passed the lower bound, then overflowed `datetime`.
        ("SONALITY_AUDIT_RETENTION_DAYS", "999999", "must be a whole number between 1 and 36500"),
        ("SONALITY_BUFFER_TTL_MINUTES", "1e10", "must be a number, greater than 0 and at most"),
        ("SONALITY_MEMBER_BUDGET_SHARE", "0", "must be a number, greater than 0 and at most 1"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_code_2(
    tmp_path: Path, variable: str, value: str, allowed: str
) -> None:
    proc = run_bot_process(tmp_path, ANTHROPIC_API_KEY=FAKE_API_KEY, **{variable: value})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {variable}={value} is not allowed: ")
    assert allowed in lines[0]
    assert not (tmp_path / "data").exists(), "nothing is written before the checks pass"


def test_the_nightly_hour_and_time_together_are_refused(tmp_path: Path) -> None:
    """Two answers to "when": the bot does not guess which one was meant."""
    proc = run_bot_process(
        tmp_path,
        ANTHROPIC_API_KEY=FAKE_API_KEY,
        SONALITY_NIGHTLY_HOUR="3",
        SONALITY_NIGHTLY_TIME="04:30",
    )
    assert proc.returncode == 2, proc.stderr
    [line] = stderr_lines(proc)
    assert "SONALITY_NIGHTLY_TIME and SONALITY_NIGHTLY_HOUR are both set" in line
    assert not (tmp_path / "data").exists()


def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "notes.txt"
    not_a_dir.write_text("mine")
    proc = run_bot_process(
        tmp_path, ANTHROPIC_API_KEY=FAKE_API_KEY, SONALITY_DATA_DIR=str(not_a_dir)
    )
    assert proc.returncode == 2
    assert stderr_lines(proc) == [
        f"error: SONALITY_DATA_DIR={not_a_dir} is not allowed: it is a file, not a directory"
    ]
    assert not_a_dir.read_text() == "mine"


def test_help_lists_modes_and_settings_and_starts_nothing(tmp_path: Path) -> None:
    proc = run_bot_process(tmp_path, "--help")  # no key: --help must not need one
    assert proc.returncode == 0, proc.stderr
    for expected in (
        "terminal",
        "Discord",
        "Slack",
        "DISCORD_TOKEN",
        "SLACK_BOT_TOKEN",
        "ANTHROPIC_API_KEY",
        "SONALITY_LLM_PROVIDER",
        "SONALITY_DATA_DIR",
        "SONALITY_ESS_THRESHOLD",
        "run",
    ):
        assert expected in proc.stdout, expected
    assert proc.stderr == ""
    assert not (tmp_path / "data").exists()


def test_an_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_bot_process(tmp_path, "--verbose", ANTHROPIC_API_KEY=FAKE_API_KEY)
    assert proc.returncode == 2
    assert "usage: python3 scripts/run.py" in proc.stderr  # the form that runs in a checkout
    assert "--verbose" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists()


async def test_the_openai_provider_needs_no_anthropic_key(tmp_path: Path) -> None:
    """A local OpenAI-compatible server takes no key, and the bot asks for none."""
    async with OpenAIFake() as server:  # accepts any key, or none, like Ollama
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            cwd=tmp_path,
            env=bot_env(
                tmp_path / "data", SONALITY_LLM_PROVIDER="openai", OPENAI_BASE_URL=server.base_url
            ),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(b"hello there\n"), 120)
    assert proc.returncode == 0, err.decode()
    assert "ANTHROPIC_API_KEY" not in err.decode()
    assert len(out.decode().splitlines()) == 1
    assert "hello there" in out.decode()


async def test_validated_engine_settings_reach_the_engine(tmp_path: Path, anthropic_server) -> None:
    proc = await _start_bot(
        tmp_path / "data",
        anthropic_server.base_url,
        tmp_path,
        SONALITY_REFLECTION_EVERY="7",
    )
    out, err = await asyncio.wait_for(proc.communicate(b"/sonality status\n"), 120)
    assert proc.returncode == 0, err.decode()
    assert "Next reflection: after 7 more interaction(s)" in out.decode()


async def test_a_second_bot_on_the_same_data_dir_is_refused(
    tmp_path: Path, anthropic_server
) -> None:
    data_dir = tmp_path / "data"
    first = await _start_bot(data_dir, anthropic_server.base_url, tmp_path)
    assert first.stdin is not None and first.stdout is not None
    first.stdin.write(b"hello\n")
    await first.stdin.drain()
    assert (await asyncio.wait_for(first.stdout.readline(), 120)).decode().strip()

    second = await _start_bot(data_dir, anthropic_server.base_url, tmp_path)
    out, err = await asyncio.wait_for(second.communicate(b"hi from the second\n"), 120)
    assert second.returncode == 2
    assert out == b""
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1, err.decode()
    assert f"pid {first.pid}" in lines[0]
    assert str(data_dir) in lines[0]
    assert not any("hi from the second" in r.user_text for r in anthropic_server.requests)

    first.stdin.write(b"still there?\n")
    await first.stdin.drain()
    answer = await asyncio.wait_for(first.stdout.readline(), 120)
    assert "still there?" in answer.decode()
    first.stdin.close()
    assert await asyncio.wait_for(first.wait(), 60) == 0

    third = await _start_bot(data_dir, anthropic_server.base_url, tmp_path)
    out, err = await asyncio.wait_for(third.communicate(b"after the first\n"), 120)
    assert third.returncode == 0, err.decode()
    assert "after the first" in out.decode()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's settings")
@pytest.mark.parametrize("program", ["app", "bench", "evaluate"])
def test_the_program_starts_once_more_under_the_glibc_settings_that_scrub_freed_memory(
    tmp_path: Path, program: str
) -> None:
    """Every interpreter start writes the `GLIBC_TUNABLES` it got to a file (a
    `sitecustomize` on PYTHONPATH): each program that runs the bot, started without
    them, starts once more with them, and only once."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(
        "import os\n"
        "with open(os.environ['STARTS_FILE'], 'a') as starts:\n"
        "    starts.write(os.environ.get('GLIBC_TUNABLES', '(none)') + '\\n')\n"
    )
    env = bot_env(tmp_path / "data", STARTS_FILE=str(tmp_path / "starts"))
    env.pop("GLIBC_TUNABLES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(probe), env["PYTHONPATH"]])
    proc = subprocess.run(
        [sys.executable, "-m", program, "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout
    starts = (tmp_path / "starts").read_text().splitlines()
    assert starts == ["(none)", ":".join(SCRUBBING_TUNABLES)]


async def test_a_second_bot_sharing_the_first_ones_database_file_is_refused(
    tmp_path: Path, anthropic_server
) -> None:
    """Two data directories, one SQLite file set apart (SONALITY_DATABASE_PATH): the
    second bot would learn on the first one's communities behind its back."""
    shared = tmp_path / "shared" / "sonality.sqlite3"
    first = await _start_bot(
        tmp_path / "one", anthropic_server.base_url, tmp_path, SONALITY_DATABASE_PATH=str(shared)
    )
    assert first.stdin is not None and first.stdout is not None
    first.stdin.write(b"hello\n")
    await first.stdin.drain()
    assert (await asyncio.wait_for(first.stdout.readline(), 120)).decode().strip()

    second = await _start_bot(
        tmp_path / "two", anthropic_server.base_url, tmp_path, SONALITY_DATABASE_PATH=str(shared)
    )
    out, err = await asyncio.wait_for(second.communicate(b"hi from the second\n"), 120)
    assert second.returncode == 2 and out == b""
    [line] = [line for line in err.decode().splitlines() if line.strip()]
    assert f"pid {first.pid}" in line and f"SONALITY_DATABASE_PATH={shared}" in line
    first.stdin.close()
    assert await asyncio.wait_for(first.wait(), 60) == 0
