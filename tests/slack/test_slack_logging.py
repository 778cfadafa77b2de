"""Bolt names a logger after its app and, on every request, resets that logger's level
to the root logger's. Named "sonality", the app reset the engine's package logger, so
the engine's INFO lines (opinion moves, reflections) could vanish in Slack mode."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import aiohttp
import pytest

from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack, post_signed
from tests.slack.conftest import (
    SECRET,
    MemoryStore,
    adapter_for,
    adapter_url,
    mention_event,
    running,
)


@pytest.fixture
def engine_logger() -> Iterator[logging.Logger]:
    engine = logging.getLogger("sonality")
    saved = engine.level
    engine.setLevel(logging.INFO)
    yield engine
    engine.setLevel(saved)


async def test_a_slack_request_leaves_the_engine_logger_alone(
    fake: FakeSlack,
    runtime: RecordingRuntime,
    store: MemoryStore,
    http: aiohttp.ClientSession,
    engine_logger: logging.Logger,
) -> None:
    assert logging.getLogger().level != logging.INFO  # what Bolt would copy over it
    async with running(adapter_for(fake, runtime, store)) as adapter:
        body = mention_event()
        assert (await post_signed(http, adapter_url(adapter), SECRET, json_body=body))[0] == 200
        await fake.wait_for(fake.posts, what="reply")
    assert engine_logger.level == logging.INFO
    assert logging.getLogger("sonality.agent").isEnabledFor(logging.INFO)
