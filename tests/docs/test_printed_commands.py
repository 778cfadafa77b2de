"""The commands the bot itself prints are the ones that run where it runs.

In a checkout that is `python3 scripts/run.py …` (nothing activates `.venv`, so the
module form fails there); in an installed copy without `scripts/` (the container
image) it is `python -m app …`. The health probe is a command of the bot, so the pages
can show it in the same form as every other.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app import invocation
from app.cli import build_parser
from evaluate.command import build_parser as evaluate_parser
from tests.integration.test_startup import run_bot_process


def test_in_a_checkout_the_usage_and_examples_name_the_script() -> None:
    assert invocation.program() == "python3 scripts/run.py"
    assert build_parser()[0].format_usage().startswith("usage: python3 scripts/run.py ")
    shown = evaluate_parser().format_help()
    assert shown.startswith("usage: python3 scripts/run.py evaluate ")
    assert "python -m" not in shown
    assert shown.count("  python3 scripts/run.py evaluate ") == 5  # the examples


def test_an_installed_copy_names_the_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(invocation, "CHECKOUT_RUNNER", tmp_path / "scripts" / "run.py")
    assert invocation.program() == "python -m app"


def test_healthcheck_is_a_command_of_the_bot(tmp_path: Path) -> None:
    off = run_bot_process(tmp_path, "healthcheck")
    assert off.returncode == 0, off.stderr
    assert "health endpoint off" in off.stdout
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = run_bot_process(tmp_path, "healthcheck", SONALITY_HEALTH_PORT=str(port))
    assert down.returncode == 1
    assert f"no answer from http://127.0.0.1:{port}/healthz" in down.stdout
    assert not (tmp_path / "data").exists(), "a probe starts nothing"
