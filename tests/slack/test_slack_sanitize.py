"""What Slack delivers reaches the runtime as valid, bounded text (real Bolt, fake Slack).

Bolt decodes event bodies with the standard library's `json`, which turns the escape
"\\ud800" into a lone surrogate that no UTF-8 encoder (SQLite, the LLM request, the log)
accepts; names come from users.info and can be as long as a member likes.
"""

from __future__ import annotations

import aiohttp

from adapters.sanitize import MAX_COMMAND_CHARS, MAX_NAME_CHARS
from tests.fakes.recording_runtime import RecordingRuntime
from tests.fakes.slack_server import FakeSlack, FakeUser, post_signed
from tests.slack.conftest import (
    SECRET,
    MemoryStore,
    adapter_for,
    adapter_url,
    command_form,
    mention_event,
    running,
)

LONE_SURROGATE = "\ud800"  # json.dumps writes it as the escape "\ud800"
LONG_NAME = f"Eve{LONE_SURROGATE}\x07\u202e" + "e" * 300


async def test_a_mention_with_a_lone_surrogate_and_a_long_name_arrives_clean(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.users["U9"] = FakeUser("U9", LONG_NAME)
    text = f"<@UBOT> one {LONE_SURROGATE} two\r\nthree\x00 <@U9>"
    async with running(adapter_for(fake, runtime, store)) as adapter:
        body = mention_event(text=text, user="U9")
        status, _, _ = await post_signed(http, adapter_url(adapter), SECRET, json_body=body)
        assert status == 200
        await fake.wait_for(fake.posts, what="reply")
    clean_name = ("Eve\ufffd" + "e" * 300)[:MAX_NAME_CHARS]
    [message] = runtime.messages
    assert message.text == f"one \ufffd two\nthree @{clean_name}"
    assert message.user.name == clean_name
    [post] = fake.posts()
    assert post["text"] == f"echo: one \ufffd two\nthree @{clean_name}"


async def test_slash_command_text_and_caller_name_are_cleaned_and_bounded(
    fake: FakeSlack, runtime: RecordingRuntime, store: MemoryStore, http: aiohttp.ClientSession
) -> None:
    fake.users["U9"] = FakeUser("U9", LONG_NAME)
    topic = "x\x00" * 3000
    async with running(adapter_for(fake, runtime, store)) as adapter:
        form = command_form(fake, f"beliefs {topic}", user="U9")
        assert (await post_signed(http, adapter_url(adapter), SECRET, form=form))[0] == 200
        await fake.wait_for(lambda: fake.responses.get("r1"), what="answer")
    [request] = runtime.commands
    assert request.name == "beliefs"
    assert request.args == ("x" * (MAX_COMMAND_CHARS - len("beliefs ")),)
    assert request.caller.name == ("Eve\ufffd" + "e" * 300)[:MAX_NAME_CHARS]
