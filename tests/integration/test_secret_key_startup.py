"""`python -m app` refuses, in one line with exit code 2, to store Slack tokens unencrypted."""

from __future__ import annotations

from pathlib import Path

from storage.platform import KEY_COMMAND
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.integration.test_startup import run_bot_process, stderr_lines


def test_slack_oauth_without_a_secret_key_is_refused(tmp_path: Path) -> None:
    proc = run_bot_process(
        tmp_path,
        ANTHROPIC_API_KEY=FAKE_API_KEY,
        SLACK_CLIENT_ID="1.2",
        SLACK_CLIENT_SECRET="s",
        SLACK_SIGNING_SECRET="x",
    )
    assert proc.returncode == 2, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert "SONALITY_SECRET_KEY" in lines[0] and KEY_COMMAND in lines[0]


def test_a_malformed_secret_key_or_removal_delay_is_one_line(tmp_path: Path) -> None:
    for variable, value, allowed in [
        ("SONALITY_SECRET_KEY", "hunter2", "Fernet key"),
        ("SONALITY_DELETE_AFTER_REMOVAL_DAYS", "-1", "between 0 and 36500"),
    ]:
        proc = run_bot_process(tmp_path, ANTHROPIC_API_KEY=FAKE_API_KEY, **{variable: value})
        assert proc.returncode == 2, proc.stderr
        lines = stderr_lines(proc)
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"error: {variable}=") and allowed in lines[0], lines[0]
        assert "hunter2" not in lines[0]  # a secret is not echoed back
