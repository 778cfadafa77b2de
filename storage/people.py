"""Who argued what: the reads behind pictures that credit members for opinion moves.

Why a mixin of its own: no commit stores per-member provenance yet, so a view that
colours a committed move by the member whose argument caused it has to rebuild that
from two places, the audit trail's "ess" events (who staged which update) and the
`interactions` outbox (the name each member spoke under). Both reads are scoped by
community like every other query here.

Names are returned exactly as stored. When a member is forgotten, the forget-me work
replaces their name and id with a pseudonym in these tables; this module never looks a
name up anywhere else, so a forgotten member can only ever appear under that pseudonym.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from storage.base import Conn, SqlBase, fetchall, from_json, id_chunks

#: Newest "ess" events with staged updates read at most (a belief's credit older than
#: that many arguments is shown as unknown rather than making the read unbounded).
MAX_STAGED_EVENTS = 20_000


class StagedEntry(BaseModel):
    """One opinion update an argument staged: topic, signed step, interaction it is due."""

    model_config = ConfigDict(frozen=True)

    topic: str
    delta: float
    due: int


class StagedArgument(BaseModel):
    """An "ess" audit event that staged at least one update, reduced to what credit needs."""

    model_config = ConfigDict(frozen=True)

    version: int
    interaction: int
    speaker: str
    staged: tuple[StagedEntry, ...]


def _staged_entries(raw: Any) -> tuple[StagedEntry, ...]:
    """The payload's `staged` list; malformed entries (an older or foreign writer) are
    skipped, so one bad row costs one dot its colour, not the whole picture."""
    if not isinstance(raw, list):
        return ()
    entries = []
    for item in raw:
        try:
            entries.append(StagedEntry.model_validate(item))
        except ValidationError:
            continue
    return tuple(entries)


class PeopleStore(SqlBase):
    async def speaker_names(self, community_id: str, speaker_ids: Iterable[str]) -> dict[str, str]:
        """The latest name each member spoke under in this community (ids never seen, or
        seen only with an empty name, are left out)."""
        wanted = sorted({s for s in speaker_ids if s})
        if not wanted:
            return {}

        def work(conn: Conn) -> dict[str, str]:
            names: dict[str, str] = {}
            for chunk, marks in id_chunks(wanted):
                rows = fetchall(
                    conn,
                    "SELECT speaker_id, speaker_name FROM interactions "
                    f"WHERE community_id = ? AND speaker_id IN ({marks}) AND speaker_name != '' "
                    "ORDER BY seq",
                    (community_id, *chunk),
                )
                names.update({str(r[0]): str(r[1]) for r in rows})  # later rows win
            return names

        return await self._run_read(work)

    async def staged_arguments(
        self, community_id: str, up_to_version: int | None = None
    ) -> list[StagedArgument]:
        """ "ess" events that staged updates, oldest first, at or below `up_to_version`
        (the newest `MAX_STAGED_EVENTS` of them)."""
        rows = await self._run_read(lambda conn: staged_rows(conn, community_id, up_to_version))
        return parse_staged_arguments(rows)


def staged_rows(conn: Conn, community_id: str, up_to_version: int | None = None) -> list[StagedRow]:
    """The "ess" events behind `PeopleStore.staged_arguments`, oldest first, unparsed:
    for a caller that parses them elsewhere (the timeline's worker process) with
    `parse_staged_arguments`."""
    sql_of = conn.dialect
    sql = (
        f"SELECT version, interaction, {sql_of.json_text('payload_json', 'speaker')}, "
        f"{sql_of.json_text('payload_json', 'staged')} FROM audit_events "
        "WHERE community_id = ? AND kind = 'ess' "
        f"AND {sql_of.json_array_not_empty('payload_json', 'staged')}"
    )
    params: list[object] = [community_id]
    if up_to_version is not None:
        sql += " AND version <= ?"
        params.append(up_to_version)
    rows = fetchall(conn, sql + " ORDER BY id DESC LIMIT ?", (*params, MAX_STAGED_EVENTS))
    return [
        (int(version), int(interaction), str(speaker or ""), str(staged or ""))
        for version, interaction, speaker, staged in reversed(rows)
    ]


#: (version, interaction, speaker, staged list as JSON) of one "ess" event.
StagedRow = tuple[int, int, str, str]


def parse_staged_arguments(rows: Iterable[StagedRow]) -> list[StagedArgument]:
    """The events of `staged_argument_rows` that staged at least one valid update."""
    found = []
    for version, interaction, speaker, staged in rows:
        entries = _staged_entries(from_json(staged) if staged else None)
        if entries:
            found.append(
                StagedArgument(
                    version=version, interaction=interaction, speaker=speaker, staged=entries
                )
            )
    return found
