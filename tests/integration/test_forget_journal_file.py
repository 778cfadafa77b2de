"""`forget-journal.json`, the journal outside the database: forget-me requests and, since
deleted messages are journaled there too, the messages taken back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from bot.forget_journal import FORMAT, ForgetJournal
from storage.deletion import DeletionEntry
from storage.forget import JournalEntry

AT = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
FORGOTTEN = JournalEntry(pseudonym="member-1a2b3c", key="salt:digest1", at=AT)
DELETED = DeletionEntry(label="message-4d5e6f", key="salt:digest2", cause="deleted", at=AT)
EDITED = DeletionEntry(label="message-7a8b9c", key="salt:digest3", cause="edited", at=AT)


def test_a_file_from_before_deletions_were_journaled_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "forget-journal.json"
    old = {"format": FORMAT, "about": "…", "forgotten": [FORGOTTEN.model_dump(mode="json")]}
    path.write_text(json.dumps(old))
    journal = ForgetJournal(path)
    assert journal.entries() == [FORGOTTEN]
    assert journal.deletions() == []
    journal.add_deletions([DELETED])
    assert journal.entries() == [FORGOTTEN]  # the forget-me kept when the file is rewritten
    assert journal.deletions() == [DELETED]


def test_a_deletion_is_added_once_and_copied_with_the_forget_mes(tmp_path: Path) -> None:
    here = ForgetJournal(tmp_path / "here.json")
    here.add_deletions([DELETED])
    here.add_deletions([DELETED, EDITED])  # a platform's retry: the label is the identity
    assert here.deletions() == [DELETED, EDITED]
    here.add(FORGOTTEN)
    there = ForgetJournal(tmp_path / "there.json")
    there.add_deletions([EDITED])
    here.copy_to(there)
    assert there.entries() == [FORGOTTEN]
    assert there.deletions() == [EDITED, DELETED]
    assert (tmp_path / "there.json").stat().st_mode & 0o777 == 0o600
