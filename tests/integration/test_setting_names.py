"""Settings that cannot be mistyped silently, checked on the real `python -m app`.

A name under SONALITY_/DISCORD_/SLACK_ that the bot does not read is one warning line
naming the closest known setting (a refusal with SONALITY_STRICT_SETTINGS=true); a
platform given some of its settings but not its token is refused in one line, never
a quiet fallback to the terminal. The known names come from the settings model, and
every name the code or `.env.example` mentions must be one of them.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from app.setting_names import REMOVED, closest, known_names, removed_names, unknown_names
from bot.settings import Settings
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.test_process import _start_bot
from tests.integration.test_startup import run_bot_process, stderr_lines

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\b(?:SONALITY|DISCORD|SLACK)_[A-Z0-9_]*[A-Z0-9]\b")
#: Where the project names settings: the product's code, the example, the deployment
#: and the documentation a newcomer copies settings from.
PRODUCT = (
    "app",
    "bot",
    "evaluate",
    "adapters",
    "providers",
    "storage",
    "chroma_memory",
    "sonality",
    "scripts",
)
DEPLOYMENT = (".env.example", "Dockerfile", "Procfile", "docker-compose.yml", "deploy")
DOCUMENTS = ("README.md", "docs", "docker-compose.scale.yml", "slack")
#: A placeholder in prose, and the test suite's own switches (tests/stack.py), which
#: the bot does not read.
NOT_SETTINGS = {"SONALITY_X", "SONALITY_TEST_STACK", "SONALITY_TEST_CHROMA"}


def _mentioned(paths: list[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in paths:
        if path.suffix in {".png", ".svg", ".pyc"}:
            continue
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, path)
    return {n: p for n, p in found.items() if n not in NOT_SETTINGS}


def _files(entries: tuple[str, ...], pattern: str = "*") -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        path = ROOT / entry
        files += sorted(p for p in path.rglob(pattern) if p.is_file()) if path.is_dir() else []
        files += [path] if path.is_file() else []
    return files


def test_every_setting_the_code_the_example_or_the_documents_name_is_known() -> None:
    """A removed setting is named only where the bot says it is gone."""
    notes = ROOT / "app" / "setting_names.py"
    files = _files(PRODUCT, "*.py") + _files(DEPLOYMENT) + _files(DOCUMENTS)
    mentioned = _mentioned([p for p in files if p != notes])
    assert len(mentioned) > 60, "the scan must see the settings the code reads"
    assert "SONALITY_TEST_KILL_AT_FORGET_STEP" in mentioned  # read with os.environ
    unknown = {n: str(p.relative_to(ROOT)) for n, p in mentioned.items() if n not in known_names()}
    assert not unknown, f"named but not a setting: {unknown}"
    assert set(REMOVED) <= set(_mentioned([notes])) and not set(REMOVED) & known_names()


def test_every_name_in_the_example_is_a_setting_and_every_field_is_known() -> None:
    example = {
        m.group(1)
        for m in re.finditer(r"^#?\s*([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M)
    }
    assert {"SONALITY_DAILY_BUDGET_USD", "DISCORD_TOKEN", "SLACK_APP_TOKEN"} <= example
    assert example <= known_names()
    # A field added to the model is known without any other list to update.
    aliases = {f.alias for f in Settings.model_fields.values()}
    assert None not in aliases and aliases <= known_names()
    assert "SONALITY_STRICT_SETTINGS" in known_names()


def test_the_closest_known_name_is_offered() -> None:
    known = known_names()
    assert closest("SONALITY_DAILY_BUDGET", known) == "SONALITY_DAILY_BUDGET_USD"
    assert closest("DISCORD_TOKN", known) == "DISCORD_TOKEN"
    assert closest("sonality_reflect_every", known) == "SONALITY_REFLECTION_EVERY"
    assert closest("SONALITY_ZZZZZZZZZZZZZZZZZZZZZZZ", known) is None
    found = unknown_names(
        {"SONALITY_DATA_DIR": "x", "SLACK_BOT_TOKN": "x", "PATH": "x", "sonality_model": "x"},
        {"SONALITY_DAILY_BUDGET": "2"},
    )
    assert found == [("SLACK_BOT_TOKN", "in the environment"), ("SONALITY_DAILY_BUDGET", "in .env")]


def test_a_removed_setting_is_neither_known_nor_unknown() -> None:
    environ = {"SONALITY_MEMORY_PROCESS": "true", "SONALITY_DAILY_BUDGET": "2"}
    assert unknown_names(environ, {}) == [("SONALITY_DAILY_BUDGET", "in the environment")]
    assert removed_names(environ, {}) == [("SONALITY_MEMORY_PROCESS", "in the environment")]
    assert removed_names({}, {"sonality_memory_process": "false"}) == [
        ("sonality_memory_process", "in .env")
    ]


async def _terminal(
    tmp_path: Path, server: AnthropicFake, stdin: bytes, **env: str
) -> tuple[int, str, list[str]]:
    proc = await _start_bot(tmp_path / "data", server.base_url, tmp_path, **env)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), [x for x in err.decode().splitlines() if x.strip()]


@pytest.mark.parametrize("where", ["in .env", "in the environment"])
async def test_a_mistyped_setting_is_one_warning_naming_the_right_one(
    tmp_path: Path, anthropic_server: AnthropicFake, where: str
) -> None:
    """`SONALITY_DAILY_BUDGET=2` used to start a bot with no spending limit, silently."""
    env: dict[str, str] = {}
    if where == "in .env":
        (tmp_path / ".env").write_text("SONALITY_DAILY_BUDGET=2\n")
    else:
        env["SONALITY_DAILY_BUDGET"] = "2"
    code, out, err = await _terminal(tmp_path, anthropic_server, b"hello\n", **env)
    assert code == 0, err
    assert "hello" in out  # a warning, not a refusal
    [line] = [x for x in err if "SONALITY_DAILY_BUDGET" in x]
    assert line.startswith(f"warning: SONALITY_DAILY_BUDGET ({where}) is not a setting")
    assert line.endswith("did you mean SONALITY_DAILY_BUDGET_USD?")
    assert "=2" not in line  # values are never echoed: the name may hold a secret


def test_strict_settings_refuse_a_mistyped_name_in_one_line(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SONALITY_DAILY_BUDGET=2\nSLACK_BOT_TOKN=xoxb-1\n")
    proc = run_bot_process(
        tmp_path, ANTHROPIC_API_KEY=FAKE_API_KEY, SONALITY_STRICT_SETTINGS="true"
    )
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [
        "error: SLACK_BOT_TOKN (in .env) is not a setting of this bot, refused as "
        "SONALITY_STRICT_SETTINGS=true; did you mean SLACK_BOT_TOKEN? "
        "(and 1 more unknown setting(s))"
    ]
    assert not (tmp_path / "data").exists(), "refused before anything is written"


async def test_a_removed_setting_is_one_note_and_the_bot_runs(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    """SONALITY_MEMORY_PROCESS (the memory process is gone) left in a deployment's .env:
    the bot says so in one line and runs, even with strict settings."""
    (tmp_path / ".env").write_text("SONALITY_MEMORY_PROCESS=true\nSONALITY_STRICT_SETTINGS=true\n")
    code, out, err = await _terminal(tmp_path, anthropic_server, b"hello\n")
    assert code == 0, err
    assert "hello" in out
    assert [x for x in err if x.startswith(("note:", "warning:", "error:"))] == [
        "note: SONALITY_MEMORY_PROCESS (in .env) is no longer a setting and is ignored: the "
        "memory process was removed; Chroma runs in the bot's process, or on a Chroma server "
        "with CHROMA_URL"
    ]


async def test_known_settings_only_give_no_warning(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    (tmp_path / ".env").write_text("SONALITY_DAILY_BUDGET_USD=2\nSONALITY_STRICT_SETTINGS=true\n")
    code, out, err = await _terminal(tmp_path, anthropic_server, b"hello\n")
    assert code == 0, err
    assert "hello" in out
    assert not [x for x in err if x.startswith(("warning:", "error:"))], err


@pytest.mark.parametrize(
    ("env", "named", "missing"),
    [
        ({"SLACK_APP_TOKEN": "xapp-1-A-1-x"}, "SLACK_APP_TOKEN is set", "SLACK_BOT_TOKEN"),
        (
            {"SLACK_SIGNING_SECRET": "s", "SLACK_MODERATOR_IDS": "U1"},
            "SLACK_MODERATOR_IDS, SLACK_SIGNING_SECRET are set",
            "SLACK_BOT_TOKEN",
        ),
        ({"DISCORD_ALLOW_DMS": "true"}, "DISCORD_ALLOW_DMS is set", "DISCORD_TOKEN"),
    ],
)
async def test_a_half_set_platform_is_one_error_line_not_the_terminal(
    tmp_path: Path, anthropic_server: AnthropicFake, env: dict[str, str], named: str, missing: str
) -> None:
    """Under systemd or Docker the terminal would read an empty stdin and exit 0."""
    code, out, err = await _terminal(tmp_path, anthropic_server, b"hello\n", **env)
    assert code == 2, err
    assert out == ""
    assert err == [
        f"error: {named} but {missing} is not: set {missing}"
        + (" (or SLACK_CLIENT_ID for many workspaces)" if missing.startswith("SLACK") else "")
        + f" to run on {missing.split('_')[0].title()}, or remove the "
        f"{missing.split('_')[0]}_* settings to chat in the terminal"
    ]
    assert not anthropic_server.requests, "nothing was checked or answered"
    assert not (tmp_path / "data").exists()


async def test_a_slack_bot_token_without_a_mode_is_one_error_line(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    """The other half: a bot token with neither Socket Mode's nor HTTP mode's secret."""
    code, out, err = await _terminal(
        tmp_path, anthropic_server, b"hello\n", SLACK_BOT_TOKEN="xoxb-1"
    )
    assert code == 2, err
    assert "hello" not in out  # the Slack adapter refuses it, the terminal never runs
    assert err == [
        "error: Slack HTTP mode needs SLACK_SIGNING_SECRET (or set SLACK_APP_TOKEN for Socket Mode)"
    ]
