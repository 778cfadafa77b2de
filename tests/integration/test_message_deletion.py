"""Deleted and edited messages through the real runtime (issue 25, item 4): the cases
the per-platform tests (test_deletion_discord.py, test_deletion_slack.py) do not reach.

- On every stack (SQLite + Chroma directory, PostgreSQL + Chroma server): the deleted
  argument's move undone to 1e-9 of a community that never heard it, its word and ids
  in no row of any table and no memory (past versions redacted through the
  database's own redaction gate, which PostgreSQL enforces with its own trigger).
- A message deleted while its answer is being written: the answer goes out, nothing of
  the message is recorded or learned, not even after a restart.
- A message answered but not learned yet when deleted: it is never learned (no version);
  one deleted while its learning waits for the model: what that learning wrote goes too.
- An edit while the answer is being written: the old words are not recorded, the new
  ones are answered and learned.
- A rollback to before the deletion leaves the message out again.
- A deletion a crash interrupted is finished on the next start; several, in one replay.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.wiring import open_runtime
from bot.forget_journal import FILE_NAME, ForgetJournal
from bot.forget_me import forget_member
from bot.messages import Community, IncomingMessage, Reply, ReplyKind, User
from bot.runtime import Runtime
from sonality.agent import MessageWords
from storage.deletion import MessageDeletion
from tests.fakes.anthropic_server import AnthropicFake, Delay
from tests.integration.conftest import (
    A,
    B,
    command,
    ess_requests,
    eventually,
    make_settings,
    prompt_of,
)
from tests.integration.deletion_scenario import (
    ARGUER,
    CHATTER,
    CONVERSATION,
    CRITIC,
    DELETED,
    EDITED,
    OWN_TOPIC,
    WORD,
    Role,
    interaction_of,
    play,
    tables_holding,
    teach,
)
from tests.integration.forget_scenario import (
    GLIMMER,
    assert_same_opinions_rebased,
    differs_somewhere,
    no_automatic_reflection,  # noqa: F401 (fixture)
    rate_glimmer,
    reflect_at_the_delete,
)
from tests.integration.test_backup import bot_command
from tests.stack import on_every_stack

pytestmark = pytest.mark.usefixtures("no_automatic_reflection")

USERS = {
    ARGUER: User(id="u-ari", name="Ari"),
    CRITIC: User(id="u-cris", name="Cris"),
    CHATTER: User(id="u-chas", name="Chas"),
}
PLATFORM = "test"  # the communities A and B are "test:..."


class Chat:
    """Members speaking in A and B with platform message ids, as an adapter does."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.ids = iter(range(5_000_001, 10_000_000))

    def message(self, community: Community, user: User, text: str) -> IncomingMessage:
        return IncomingMessage(
            community=community,
            channel_id="c1",
            message_id=str(next(self.ids)),
            user=user,
            text=text,
        )

    async def say(self, community: str, role: Role, text: str) -> str:
        where = A if community == A.id else B
        message = self.message(where, USERS[role], text)
        reply = await self.runtime.handle(message)
        assert reply is not None and reply.kind is ReplyKind.ANSWER
        await self.runtime.drain()
        assert message.message_id is not None
        return message.message_id


def sponge(runtime: Runtime, community: Community) -> Any:
    agent = runtime.registry.get(community.id)
    assert agent is not None
    return agent.sponge


@on_every_stack
async def test_a_deleted_argument_leaves_no_trace_on_every_stack(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        chat = Chat(runtime)
        played = await play(chat.say, A.id, B.id)
        heard_all = sponge(runtime, A).model_copy(deep=True)
        assert OWN_TOPIC in heard_all.opinion_vectors
        interaction_id = await interaction_of(runtime.db, f"{PLATFORM}:{played.deleted}")
        needles = [WORD, played.deleted, interaction_id]
        before = await tables_holding(runtime.db, needles)
        assert any(f.startswith("personality_versions") for f in before), before

        assert await runtime.message_deleted(PLATFORM, played.deleted) == 1

        assert_same_opinions_rebased(sponge(runtime, A), sponge(runtime, B))
        assert differs_somewhere(sponge(runtime, A), heard_all)
        agent = runtime.registry.get(A.id)
        assert agent is not None
        await agent.flush_episodes()
        assert await tables_holding(runtime.db, needles) == []
        assert agent.episodes.stored([interaction_id]) == []
        assert [d for d in await runtime.db.open_deletions()] == []
        # Deleted twice (a platform's retry): nothing more happens.
        versions = len(await runtime.db.community(A.id).versions(limit=1000))
        assert await runtime.message_deleted(PLATFORM, played.deleted) == 0
        assert len(await runtime.db.community(A.id).versions(limit=1000)) == versions


async def slow_answer(
    runtime: Runtime, server: AnthropicFake, message: IncomingMessage
) -> asyncio.Task[Reply | None]:
    """`message`, with the model taking 1.5 s to answer; returns once the request for
    the answer has reached the fake."""
    server.enqueue(Delay(1.5))
    task = asyncio.create_task(runtime.handle(message))
    assert await eventually(lambda: server.in_flight > 0, 10)
    return task


async def test_a_message_deleted_while_answered_is_neither_kept_nor_learned(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    async with open_runtime(settings, llm=llm) as runtime:
        chat = Chat(runtime)
        await chat.say(A.id, CRITIC, CONVERSATION[1].text)
        message = chat.message(A, USERS[ARGUER], DELETED)
        assert message.message_id is not None
        slow = await slow_answer(runtime, anthropic_server, message)
        assert await runtime.message_deleted(PLATFORM, message.message_id) == 0
        reply = await slow
        assert reply is not None and reply.kind is ReplyKind.ANSWER  # it still went out
        await runtime.drain()
        assert await runtime.db.communities_holding(f"{PLATFORM}:{message.message_id}") == []
        assert await tables_holding(runtime.db, [WORD]) == []
        assert not [r for r in ess_requests(anthropic_server) if WORD in r.user_text]
        [latest] = await runtime.db.community(A.id).versions(limit=1)
        assert latest.version == sponge(runtime, A).version == 1  # the seed, one message
    async with open_runtime(settings, llm=llm) as runtime:
        await runtime.drain()
        assert await runtime.db.community(A.id).pending_interactions() == []
        assert not [r for r in ess_requests(anthropic_server) if WORD in r.user_text]


async def test_a_message_deleted_before_it_was_learned_is_never_learned(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Answered and recorded, but its learning waits behind a slow one (the model takes
    1.5 s a call from the first message's learning on): the deletion comes first, takes
    it out of the queue, and writes no version."""
    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        chat = Chat(runtime)
        first = chat.message(A, USERS[CRITIC], CONVERSATION[1].text)
        assert await runtime.handle(first) is not None
        anthropic_server.latency = 1.5  # the first message's learning has not asked yet
        second = chat.message(A, USERS[ARGUER], DELETED)
        assert await runtime.handle(second) is not None
        assert second.message_id is not None
        assert await runtime.db.communities_holding(f"{PLATFORM}:{second.message_id}")
        assert sponge(runtime, A).interaction_count == 0  # the first is still learning
        assert await runtime.message_deleted(PLATFORM, second.message_id) == 1
        anthropic_server.latency = 0
        await runtime.drain()
        versions = await runtime.db.community(A.id).versions(limit=10)
        assert [v.cause for v in versions] == ["interaction", "seed"]
        assert await tables_holding(runtime.db, [WORD]) == []
        assert not [r for r in ess_requests(anthropic_server) if WORD in r.user_text]


async def test_an_edit_while_the_answer_is_written_answers_the_new_words(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        chat = Chat(runtime)
        message = chat.message(A, USERS[ARGUER], DELETED)
        assert message.message_id is not None
        slow = await slow_answer(runtime, anthropic_server, message)
        # The same words (a preview) change nothing; new words are to be answered anew.
        assert await runtime.message_edited(PLATFORM, message.message_id, DELETED) is False
        assert await runtime.message_edited(PLATFORM, message.message_id, EDITED) is True
        edited = message.model_copy(update={"text": EDITED})
        assert await runtime.handle(edited) is not None
        await slow
        await runtime.drain()
        [(kept,)] = await runtime.db._fetchall(
            "SELECT message FROM interactions WHERE message_ref = ?",
            (f"{PLATFORM}:{message.message_id}",),
        )
        assert kept == EDITED
        assert await tables_holding(runtime.db, [WORD]) == []
        assert sponge(runtime, A).interaction_count == 1


async def test_a_rollback_to_before_the_deletion_leaves_the_message_out(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        chat = Chat(runtime)
        played = await play(chat.say, A.id, B.id)
        target = sponge(runtime, A).version
        await runtime.message_deleted(PLATFORM, played.deleted)
        await chat.say(A.id, CHATTER, "Back from lunch.")
        await chat.say(B.id, CHATTER, "Back from lunch.")
        done = await command(runtime, "rollback", str(target))
        assert done.ok, done.text
        # The state of v`target` without the deleted message: B before its last line.
        never_saw = await runtime.db.community(B.id).state_at(sponge(runtime, B).version - 1)
        assert never_saw is not None
        assert_same_opinions_rebased(sponge(runtime, A), never_saw)
        [latest] = await runtime.db.community(A.id).versions(limit=1)
        assert latest.cause == "forget-me" and "deleted messages re-applied" in latest.change


async def journal_arguments(
    runtime: Runtime, count: int
) -> tuple[list[str], list[MessageDeletion]]:
    """Play the conversation, then journal the deletion of the first `count` messages
    said in A by its arguers, and nothing more (as a crash right after would leave
    them): their references and journal rows."""
    chat = Chat(runtime)
    said: list[str] = []

    async def say(community: str, role: Role, text: str) -> str:
        message_id = await chat.say(community, role, text)
        if community == A.id and role is not CHATTER:
            said.append(message_id)
        return message_id

    await play(say, A.id, B.id)
    refs = [f"{PLATFORM}:{message_id}" for message_id in said[:count]]
    now = datetime.now(UTC)
    deletions = [
        d for ref in refs for d in await runtime.db.begin_deletion(A.id, ref, "deleted", now)
    ]
    return refs, deletions


async def test_a_deletion_a_crash_interrupted_is_finished_on_start(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Only the journal row was written (the process died right after it): the next
    start takes the message back before learning anything."""
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    async with open_runtime(settings, llm=llm) as runtime:
        chat = Chat(runtime)
        played = await play(chat.say, A.id, B.id)
        ref = f"{PLATFORM}:{played.deleted}"
        [open_] = await runtime.db.begin_deletion(A.id, ref, "deleted", datetime.now(UTC))
        assert open_.interaction_id is not None
        assert await runtime.db.open_deletions() == [open_]
    async with open_runtime(settings, llm=llm) as runtime:
        assert await runtime.db.open_deletions() == []
        assert await runtime.db.communities_holding(ref) == []
        a = await runtime.registry.agent_for(A)
        b = await runtime.registry.agent_for(B)
        assert_same_opinions_rebased(a.sponge, b.sponge)
        assert await tables_holding(runtime.db, [WORD]) == []


async def test_deletions_a_crash_interrupted_are_finished_on_start_together(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Four messages journaled and then the process died, none replayed yet: the next
    start hands them over at once, so they share a replay (one version naming them),
    not one each. Two at most: one arriving later than the agent's gathering time
    after the others (a stalled machine) still joins in the pause after that replay."""
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    async with open_runtime(settings, llm=llm) as runtime:
        refs, deletions = await journal_arguments(runtime, 4)
        assert len(deletions) == 4
        before = await runtime.db.community(A.id).versions(limit=1000)
    async with open_runtime(settings, llm=llm) as runtime:
        assert await runtime.db.open_deletions() == []
        for ref in refs:
            assert await runtime.db.communities_holding(ref) == []
        after = await runtime.db.community(A.id).versions(limit=1000)
        new = after[: len(after) - len(before)]
        assert 1 <= len(new) <= 2 and {v.cause for v in new} == {"message-deleted"}
        named = [label for v in new for label in (v.actor or "").split(", ")]
        assert sorted(named) == sorted(d.label for d in deletions)


async def test_messages_taken_back_together_are_finished_after_a_crash_without_a_new_replay(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Four deletions replayed together (one version naming all), then the process died
    before any was finished: the next start finds that version for each and only
    erases what is left, with no second replay. `history` names two and counts the rest."""
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    async with open_runtime(settings, llm=llm) as runtime:
        refs, deletions = await journal_arguments(runtime, 4)
        agent = await runtime.registry.agent_for(A)

        def words_of(interaction_id: str) -> MessageWords:
            async def words() -> tuple[list[str], list[str]]:  # as `finish_deletion` reads
                found = await runtime.db.message_words(A.id, interaction_id)
                return list(found.texts), list(found.topics)

            return words

        async with agent._changing():  # busy: both wait, and are replayed together
            waiting = [
                asyncio.create_task(
                    agent.withdraw_message(
                        d.interaction_id or "",
                        actor=d.label,
                        change="deleted",
                        words=words_of(d.interaction_id or ""),
                    )
                )
                for d in deletions
            ]
            await asyncio.sleep(0)
        first, *others = await asyncio.gather(*waiting)
        assert first is not None and all(other is first for other in others) and len(others) == 3
        versions = await runtime.db.community(A.id).versions(limit=1000)
        assert versions[0].actor == ", ".join(d.label for d in deletions)
        # The process dies here: no deletion got its version, nothing was erased.
    async with open_runtime(settings, llm=llm) as runtime:
        assert await runtime.db.open_deletions() == []
        after = await runtime.db.community(A.id).versions(limit=1000)
        # No version was added (the erase only redacts the words of those there are).
        assert [(v.version, v.cause, v.actor) for v in after] == [
            (v.version, v.cause, v.actor) for v in versions
        ]
        for ref in refs:
            assert await runtime.db.communities_holding(ref) == []
        rows = await runtime.db._fetchall(
            "SELECT version FROM message_deletions WHERE community_id = ?", (A.id,)
        )
        assert rows == [(first.version,)] * 4
        history = await command(runtime, "history")
        [line] = [ln for ln in history.text.splitlines() if ln.startswith(f"v{first.version} ")]
        labels = [d.label for d in deletions]
        assert f"by {labels[0]}, {labels[1]} and 2 more]" in line, line
        assert labels[2] not in line and labels[3] not in line
        assert "(and 3 more taken back in the same replay)" in line


async def test_a_message_deleted_while_it_is_learned_leaves_no_word(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """Deleted while its learning waits for the model (the ESS request is in flight,
    under the agent's lock): the learning commits first, and the deletion must then take
    back what that commit wrote (summary, insight, own topic), not what was there when
    the deletion came."""
    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        chat = Chat(runtime)
        await chat.say(A.id, CRITIC, CONVERSATION[1].text)
        await chat.say(B.id, CRITIC, CONVERSATION[1].text)
        message = chat.message(A, USERS[ARGUER], DELETED)
        assert message.message_id is not None
        # The answer at once, then its learning's first request held 1.5 s.
        anthropic_server.enqueue(Delay(0), Delay(1.5))
        assert await runtime.handle(message) is not None
        assert await eventually(lambda: anthropic_server.in_flight > 0, 10)
        assert [r for r in ess_requests(anthropic_server) if WORD in r.user_text]
        interaction_id = await interaction_of(runtime.db, f"{PLATFORM}:{message.message_id}")
        assert await runtime.message_deleted(PLATFORM, message.message_id) == 1
        await runtime.drain()
        agent = runtime.registry.get(A.id)
        assert agent is not None
        await agent.flush_episodes()
        assert agent.episodes.stored([interaction_id]) == []
        versions = await runtime.db.community(A.id).versions(limit=10)
        causes = ["message-deleted", "interaction", "interaction", "seed"]
        assert [v.cause for v in versions] == causes
        assert_same_opinions_rebased(sponge(runtime, A), sponge(runtime, B))
        assert OWN_TOPIC not in sponge(runtime, A).opinion_vectors
        assert await tables_holding(runtime.db, [WORD]) == []


async def test_a_forget_me_while_a_message_of_theirs_is_learned_leaves_no_word(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """The same race for forget-me: the member's last message is being learned (its ESS
    request in flight) when they are forgotten; what that learning commits goes too."""
    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        chat = Chat(runtime)
        await chat.say(A.id, CRITIC, CONVERSATION[1].text)
        await chat.say(B.id, CRITIC, CONVERSATION[1].text)
        anthropic_server.enqueue(Delay(0), Delay(1.5))
        assert await runtime.handle(chat.message(A, USERS[ARGUER], DELETED)) is not None
        assert await eventually(lambda: anthropic_server.in_flight > 0, 10)
        agent = await runtime.registry.agent_for(A)
        done = await forget_member(runtime.db, agent, A.id, USERS[ARGUER].id, requested_by="self")
        assert done.version is not None
        await runtime.drain()
        await agent.flush_episodes()
        assert_same_opinions_rebased(sponge(runtime, A), sponge(runtime, B))
        assert OWN_TOPIC not in sponge(runtime, A).opinion_vectors
        assert await tables_holding(runtime.db, [WORD, USERS[ARGUER].id]) == []


async def test_the_log_is_read_and_replayed_off_the_event_loop(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion (and a forget-me) parses and replays the whole evidence log: seconds of
    CPU on a long one (bench figure 7b), during which every community's replies would
    wait if it ran on the event loop's thread. Nor may anything hold every thread while
    it runs: the garbage collector is off (its full collections would walk every parsed
    step) and back on after, and the parsed log is emptied a slice at a time, not freed
    in one call."""
    import sonality.agent
    import storage.community

    threads: dict[str, set[bool]] = {"parse": set(), "replay": set()}
    collecting: list[bool] = []
    logs: list[list[Any]] = []

    def watched(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            threads[name].add(threading.current_thread() is threading.main_thread())
            if name == "replay":
                collecting.append(gc.isenabled())
                logs.append(args[0])
            return real(*args, **kwargs)

        return call

    teach(anthropic_server.brain)
    async with open_runtime(make_settings(tmp_path / "data"), llm=llm) as runtime:
        assert threading.current_thread() is threading.main_thread()  # the loop's thread
        chat = Chat(runtime)
        played = await play(chat.say, A.id, B.id)
        monkeypatch.setattr(
            storage.community, "step_from_row", watched("parse", storage.community.step_from_row)
        )
        monkeypatch.setattr(
            sonality.agent, "forgotten", watched("replay", sonality.agent.forgotten)
        )
        assert gc.isenabled()
        assert await runtime.message_deleted(PLATFORM, played.deleted) == 1
        assert gc.isenabled()
    assert threads == {"parse": {False}, "replay": {False}}
    assert collecting == [False]
    [log] = logs
    assert isinstance(log, list) and log == []  # released, its steps no longer held


async def test_a_backup_from_before_a_deletion_restored_takes_the_message_back_again(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    """The database's journal of deletions is restored with it, from before: the journal
    file outside it (`forget-journal.json`) has the deletion, `restore` journals it again
    and the bot takes the message back when it starts, before learning anything."""
    teach(anthropic_server.brain)
    settings = make_settings(tmp_path / "data")
    async with open_runtime(settings, llm=llm) as runtime:
        played = await play(Chat(runtime).say, A.id, B.id)
        interaction_id = await interaction_of(runtime.db, f"{PLATFORM}:{played.deleted}")
    made = await asyncio.to_thread(
        bot_command, tmp_path, settings.data_dir, "backup", str(tmp_path / "backup")
    )
    assert made.returncode == 0, made.stderr
    needles = [WORD, played.deleted, interaction_id]

    async with open_runtime(settings, llm=llm) as runtime:
        assert await runtime.message_deleted(PLATFORM, played.deleted) == 1
        after_deletion = sponge(runtime, A).model_copy(deep=True)
        assert await tables_holding(runtime.db, needles) == []
    [entry] = ForgetJournal.in_data_dir(settings.data_dir).deletions()
    assert played.deleted not in entry.model_dump_json()  # a salted key, not the id

    put_back = await asyncio.to_thread(
        bot_command,
        tmp_path,
        tmp_path / "restored",
        "restore",
        str(tmp_path / "backup"),
        "--forget-journal",
        str(settings.data_dir / FILE_NAME),
    )
    assert put_back.returncode == 0, put_back.stderr
    assert "1 deleted message(s)" in put_back.stdout
    restored = make_settings(tmp_path / "restored")
    async with open_runtime(restored, llm=llm) as runtime:
        await runtime.drain()
        assert await tables_holding(runtime.db, needles) == []
        [latest] = await runtime.db.community(A.id).versions(limit=1)
        assert latest.cause == "message-deleted"
        assert_same_opinions_rebased(sponge(runtime, A), after_deletion)
        assert [d for d in await runtime.db.open_deletions()] == []
        agent = runtime.registry.get(A.id)
        assert agent is not None
        await agent.flush_episodes()
        assert agent.episodes.stored([interaction_id]) == []  # its memory left Chroma too
    # Started again: nothing is taken back twice.
    async with open_runtime(restored, llm=llm) as runtime:
        [again] = await runtime.db.community(A.id).versions(limit=1)
        assert again.version == latest.version


async def test_a_reflection_asked_during_a_deletion_never_reads_its_memory(
    runtime: Runtime, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with forget-me (test_forget_inflight.py): a reflect that arrives once the
    deletion's replay is in, before the message's memory is deleted from Chroma, waits
    for it, so the summary never reaches the reflection's prompt."""
    rate_glimmer(anthropic_server)
    ari, chas = USERS[ARGUER], USERS[CHATTER]
    said = IncomingMessage(
        community=A, channel_id="c1", user=ari, text="A survey (glimmer).", message_id="g1"
    )
    assert await runtime.handle(said) is not None
    await runtime.handle(IncomingMessage(community=A, channel_id="c1", user=chas, text="Hi."))
    await runtime.drain()
    agent = runtime.registry.get(A.id)
    assert agent is not None
    await agent.flush_episodes()
    reflecting = reflect_at_the_delete(runtime, agent, monkeypatch, A, chas)
    before = len(anthropic_server.requests)
    assert await runtime.message_deleted(PLATFORM, "g1") == 1
    [reflected] = await asyncio.gather(*reflecting)
    assert reflected.ok, reflected.text
    asked = [prompt_of(r) for r in anthropic_server.requests[before:]]
    assert asked, "the reflection asked the model nothing"
    assert not [p for p in asked if GLIMMER in p]
