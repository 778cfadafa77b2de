"""One forget-me request finished by two processes: `begin_forget` hands the open
request to whoever asks (a double submission routed to two processes, or a process
resuming open requests at its start while another runs it). Once one has finished it,
the member may speak again and is learned like anyone; the other's late finish must
change nothing, or it replays and erases what they said since."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.forget_me import finish_forget
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401 (fixture)
from tests.integration.conftest import ALICE, A, command, say
from tests.integration.test_multi_process import two_runtimes
from tests.pg import PostgresServer


async def test_a_request_finished_elsewhere_is_not_finished_again(
    tmp_path: Path,
    postgres_server: PostgresServer,
    chroma_server: ChromaServer,  # noqa: F811
    llm: Any,
) -> None:
    async with two_runtimes(tmp_path, postgres_server, chroma_server, llm) as (one, two):
        await say(one, "Hello, the quokkaharbor study says remote work helps.", community=A)
        stale = await two.db.begin_forget(A.id, ALICE.id, "self", "", datetime.now(UTC))
        done = await command(one, "forget-me", "confirm", moderator=False)
        assert done.ok and "Forgotten" in done.text, done.text
        await say(one, "Back again, about the pelicanlantern survey.", community=A)
        kept = await one.db.member_interaction_ids(A.id, ALICE.id)
        versions = await one.db.community(A.id).versions(limit=100)
        assert len(kept) == 1

        agent = await two.registry.agent_for(A)
        late = await finish_forget(two.db, agent, stale, two.forget_journal)

        assert late.member_id is None and late.version == versions[1].version
        assert await one.db.member_interaction_ids(A.id, ALICE.id) == kept
        assert await one.db.community(A.id).versions(limit=100) == versions
