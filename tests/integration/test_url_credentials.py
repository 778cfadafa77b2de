"""A `user:password@` in OPENAI_BASE_URL or ANTHROPIC_BASE_URL (a proxy's credentials)
is refused at start, in a line that does not print it; and should one reach a log line,
a start-up message or `/healthz`, it is hidden there while the host is still named.

DATABASE_URL has always been shown as host:port/database only (storage/postgres.py);
the model endpoints were printed as configured: in the INFO line about the timeout, in
the refusal and the warning of the start-up check, and in the model client's errors,
which `/healthz` reports as `last_error` and the bot logs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import aiohttp
import pytest

from app.health import HealthEndpoint, LLMHealth
from app.logs import configure_logging, hide_credentials
from app.preflight import _Endpoint
from providers.openai import OpenAILLM
from sonality.llm import LLMError
from storage import Database
from tests.integration.test_preflight import VENDORS, assert_one_line_error, closed_port, run

SECRET = "pr0xy-s3cret"


def with_credentials(base_url: str) -> str:
    """`http://127.0.0.1:port/...` as `http://proxyuser:SECRET@127.0.0.1:port/...`."""
    scheme, rest = base_url.split("://", 1)
    return f"{scheme}://proxyuser:{SECRET}@{rest}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("at http://u:p@127.0.0.1:8080/v1 (x)", "at http://***@127.0.0.1:8080/v1 (x)"),
        ("https://sk-token@proxy.example/v1", "https://***@proxy.example/v1"),
        ("https://u:p@ss@proxy.example", "https://***@proxy.example"),  # an unescaped @
        ("URL('https://u:p@h:1/v1/models')", "URL('https://***@h:1/v1/models')"),
        ('{"message": "http://u:p@h", "x": "a@b"}', '{"message": "http://***@h", "x": "a@b"}'),
        ("https://api.openai.com/v1 and mail a@b.example", None),  # nothing to hide
        ("http://h:80/path?user=a@b", None),  # an @ after the host is not credentials
    ],
)
def test_hide_credentials(text: str, shown: str | None) -> None:
    assert hide_credentials(text) == (text if shown is None else shown)


def test_the_check_names_the_endpoint_without_its_credentials() -> None:
    """What the refusals and the "could not check model" warning name."""
    endpoint = _Endpoint(
        key_setting="OPENAI_API_KEY",
        url_setting="OPENAI_BASE_URL",
        url=with_credentials("https://proxy.example/v1"),
        default_url="https://api.openai.com/v1",
        has_key=True,
    )
    assert endpoint.where == "https://***@proxy.example/v1"
    assert endpoint.url_named == "OPENAI_BASE_URL=https://***@proxy.example/v1"


async def test_the_bot_refuses_credentials_in_a_model_url_without_printing_them(
    tmp_path: Path,
) -> None:
    """The clients send the key in a header, and the HTTP library refuses a URL with
    credentials beside it (the OpenAI client with a traceback at start): the setting is
    refused in one line, which names it but not the password."""
    vendor = VENDORS["anthropic"]
    host = f"127.0.0.1:{closed_port()}"
    env = vendor.env(tmp_path / "data", f"http://proxyuser:{SECRET}@{host}", vendor.key)
    ended = await run(env, tmp_path)
    assert_one_line_error(ended, "ANTHROPIC_BASE_URL", "user name or password")
    assert SECRET not in ended.stderr


@pytest.fixture
def restores_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_no_log_line_shows_a_url_s_credentials(
    tmp_path: Path, log_format: Literal["text", "json"], restores_logging: None
) -> None:
    """The model clients name their endpoint in their own lines and errors (a reply that
    failed, a model without a lookup): the log scrubs every line as it is written."""
    log_file = tmp_path / "bot.log"
    configure_logging(
        level="INFO", interactive_terminal=True, log_file=log_file, log_format=log_format
    )
    client = OpenAILLM(api_key="", base_url=with_credentials("http://127.0.0.1:11434/v1"))
    await client.aclose()
    logging.getLogger("providers.openai").info("%s has no model lookup", client.endpoint)
    try:
        raise LLMError(f"could not connect to {client.endpoint} (connection refused)")
    except LLMError:
        logging.getLogger("bot.runtime").exception("the reply failed")
    logged = log_file.read_text()
    assert SECRET not in logged and "proxyuser" not in logged
    # The notice, and the error that ends the traceback.
    assert logged.count("the OpenAI-compatible API at http://***@127.0.0.1:11434/v1") == 2


async def test_healthz_reports_the_model_error_without_the_credentials(tmp_path: Path) -> None:
    client = OpenAILLM(api_key="", base_url=with_credentials("http://127.0.0.1:11434/v1"))
    await client.aclose()
    health = LLMHealth()
    # As `OpenAILLM` words a failed call, its endpoint (the configured URL) included.
    health.failed("llama3.1:8b", LLMError(f"could not connect to {client.endpoint} (refused)"))
    db = await Database.open(tmp_path / "state.sqlite3")
    endpoint = HealthEndpoint(db, health, llm_failing_seconds=300)
    try:
        await endpoint.start("127.0.0.1", 0)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{endpoint.port}/healthz") as response,
        ):
            body = await response.text()
    finally:
        await endpoint.close()
        await db.close()
    assert SECRET not in body and "proxyuser" not in body
    model = json.loads(body)["llm"]["models"]["llama3.1:8b"]
    assert model["last_error"] == (
        "could not connect to the OpenAI-compatible API at http://***@127.0.0.1:11434/v1 (refused)"
    )
