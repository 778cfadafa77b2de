"""The start-up model check on the real bot process (`python -m app`), for both vendors.

The fake runs on this test's event loop while the bot runs as a child process, so the
child reaches it over loopback exactly as it would reach the vendor.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from app.wiring import build_llm
from bot.interface import StartupError
from providers.openai import OpenAILLM
from tests.fakes.anthropic_fixtures import FAKE_API_KEY
from tests.fakes.anthropic_server import AnthropicFake, Fault
from tests.fakes.openai_fixtures import FAKE_OPENAI_KEY
from tests.fakes.openai_server import OpenAIFake
from tests.forked_bot import start_module
from tests.integration.conftest import make_settings
from tests.integration.test_process import bot_env

Fake = AnthropicFake | OpenAIFake


@dataclass(frozen=True)
class Vendor:
    provider: str
    key_setting: str
    url_setting: str
    key: str
    unknown_model: str

    def env(self, data_dir: Path, base_url: str, key: str | None, **extra: str) -> dict[str, str]:
        """The bot's environment: nothing inherited that names a vendor or the bot."""
        env = {k: v for k, v in bot_env(data_dir).items() if not k.startswith("OPENAI_")}
        env["SONALITY_LLM_PROVIDER"] = self.provider
        env[self.url_setting] = base_url
        if key is not None:
            env[self.key_setting] = key
        env.update(extra)
        return env


VENDORS = {
    "anthropic": Vendor(
        "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", FAKE_API_KEY, "claude-haiku-9"
    ),
    "openai": Vendor("openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", FAKE_OPENAI_KEY, "gpt-9"),
}


@pytest.fixture(params=sorted(VENDORS))
def vendor(request: pytest.FixtureRequest) -> Vendor:
    return VENDORS[request.param]


@pytest_asyncio.fixture
async def server(vendor: Vendor) -> AsyncIterator[Fake]:
    fake: Fake = (
        AnthropicFake(api_key=vendor.key)
        if vendor.provider == "anthropic"
        else OpenAIFake(api_key=vendor.key)
    )
    async with fake:
        yield fake


@dataclass(frozen=True)
class Ended:
    code: int | None
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


async def run(env: dict[str, str], cwd: Path, stdin: bytes = b"") -> Ended:
    proc = await start_module("app", cwd=cwd, env=env)  # forked: tests/forked_bot.py
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    return Ended(proc.returncode, out.decode(), err.decode())


def assert_one_line_error(ended: Ended, *parts: str) -> None:
    assert ended.code == 2, ended.stderr
    assert len(ended.stderr_lines) == 1, ended.stderr
    [line] = ended.stderr_lines
    assert line.startswith("error: ")
    for part in parts:
        assert part in line, line
    assert "Traceback" not in ended.stderr
    assert ended.stdout == ""


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_rejected_key_stops_the_bot_naming_the_variable(
    tmp_path: Path, vendor: Vendor, server: Fake
) -> None:
    env = vendor.env(tmp_path / "data", server.base_url, "sk-wrong-but-long-enough")
    ended = await run(env, tmp_path)
    assert_one_line_error(ended, f"{vendor.key_setting} was rejected by {server.base_url} (401)")
    assert [r.path.startswith("/v1/models/") for r in server.requests] == [True]
    assert not (tmp_path / "data" / "sonality.sqlite3").exists()


async def test_an_unknown_model_names_the_model_setting(
    tmp_path: Path, vendor: Vendor, server: Fake
) -> None:
    env = vendor.env(
        tmp_path / "data", server.base_url, vendor.key, SONALITY_ESS_MODEL=vendor.unknown_model
    )
    ended = await run(env, tmp_path)
    assert_one_line_error(
        ended, f"SONALITY_ESS_MODEL={vendor.unknown_model} is not a model this endpoint knows"
    )
    # The reply model passed the check first; the evidence model failed it.
    assert [r.path.rsplit("/", 1)[-1] for r in server.requests][-1] == vendor.unknown_model


async def test_one_unknown_model_for_both_roles_is_checked_once_and_both_are_named(
    tmp_path: Path, vendor: Vendor, server: Fake
) -> None:
    model = vendor.unknown_model
    env = vendor.env(
        tmp_path / "data",
        server.base_url,
        vendor.key,
        SONALITY_MODEL=model,
        SONALITY_ESS_MODEL=model,
    )
    ended = await run(env, tmp_path)
    assert_one_line_error(ended, f"SONALITY_MODEL={model} (also SONALITY_ESS_MODEL)")
    assert len(server.requests) == 1


async def test_an_unreachable_endpoint_names_the_url_setting(
    tmp_path: Path, vendor: Vendor
) -> None:
    suffix = "/v1" if vendor.provider == "openai" else ""
    url = f"http://127.0.0.1:{closed_port()}{suffix}"
    ended = await run(vendor.env(tmp_path / "data", url, vendor.key), tmp_path)
    assert_one_line_error(ended, f"could not reach {vendor.url_setting}={url} (connection refused)")


async def test_a_fault_of_the_moment_only_warns_and_the_bot_answers(
    tmp_path: Path, vendor: Vendor, server: Fake
) -> None:
    # The check retries once: both attempts for the reply model get the fault.
    server.enqueue(Fault(status=529, retry_after_ms=10), Fault(status=529, retry_after_ms=10))
    env = vendor.env(tmp_path / "data", server.base_url, vendor.key)
    ended = await run(env, tmp_path, b"hello after the fault\n")
    assert ended.code == 0, ended.stderr
    assert ended.stdout.splitlines()[0] == "[reply] hello after the fault"
    warnings = [line for line in ended.stderr_lines if "could not check model" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and "status 529" in warnings[0]
    assert "error:" not in ended.stderr


# --- OpenAI-compatible servers without a key or a model lookup ---------------------------

OPENAI = VENDORS["openai"]


async def test_a_keyless_local_server_needs_no_key(tmp_path: Path) -> None:
    async with OpenAIFake() as local:
        env = OPENAI.env(
            tmp_path / "data",
            local.base_url,
            None,
            SONALITY_MODEL="llama3.1:8b",
            SONALITY_ESS_MODEL="qwen2.5:7b",
        )
        ended = await run(env, tmp_path, b"hi local model\n")
    assert ended.code == 0, ended.stderr
    assert ended.stdout.splitlines()[0] == "[reply] hi local model"
    assert all("authorization" not in r.headers for r in local.requests)
    checked = [r.path for r in local.requests if r.method == "GET"]
    assert checked == ["/v1/models/llama3.1:8b", "/v1/models/qwen2.5:7b"]


async def test_a_server_that_wants_a_key_says_which_setting_is_missing(tmp_path: Path) -> None:
    async with OpenAIFake(api_key=FAKE_OPENAI_KEY) as keyed:
        ended = await run(OPENAI.env(tmp_path / "data", keyed.base_url, None), tmp_path)
    assert_one_line_error(ended, "wants an API key (401): set OPENAI_API_KEY")


@pytest.mark.parametrize("model", ["gpt-4.1", "gpt-9"])
async def test_without_a_model_lookup_a_one_token_call_checks_the_model(
    tmp_path: Path, model: str
) -> None:
    async with OpenAIFake(serves_model_lookup=False) as local:
        env = OPENAI.env(
            tmp_path / "data", local.base_url, None, SONALITY_MODEL=model, SONALITY_ESS_MODEL=model
        )
        ended = await run(env, tmp_path, b"hello\n")
    probe = local.chat_requests[0].body
    assert probe["model"] == model and probe["max_tokens"] == 1
    if model == "gpt-9":
        assert_one_line_error(ended, "SONALITY_MODEL=gpt-9 (also SONALITY_ESS_MODEL)")
    else:
        assert ended.code == 0, ended.stderr
        assert ended.stdout.splitlines()[0] == "[reply] hello"


# --- which client the settings build -----------------------------------------------------


async def test_the_provider_setting_picks_the_client(tmp_path: Path) -> None:
    llm = build_llm(make_settings(tmp_path, SONALITY_LLM_PROVIDER="openai", OPENAI_API_KEY=""))
    try:
        assert isinstance(llm, OpenAILLM)
        assert not llm.has_key and llm.default_model == "gpt-4.1"
    finally:
        await llm.aclose()
    with pytest.raises(StartupError, match="ANTHROPIC_API_KEY"):
        build_llm(make_settings(tmp_path, SONALITY_LLM_PROVIDER="anthropic", ANTHROPIC_API_KEY=""))
    with pytest.raises(StartupError, match="ANTHROPIC_API_KEY"):  # as start-up refuses it
        build_llm(make_settings(tmp_path, SONALITY_LLM_PROVIDER="anthropic", ANTHROPIC_API_KEY=" "))
