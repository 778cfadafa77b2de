"""`forget-journal.json`, the journal outside the database: forget-me requests and, since
deleted messages are journaled there too, the messages taken back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.forget_journal import FORMAT, WHOLE_FILE_FORMAT, ForgetJournal, ForgetJournalError
from storage.deletion import DeletionEntry
from storage.forget import JournalEntry

AT = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
FORGOTTEN = JournalEntry(pseudonym="member-1a2b3c", key="salt:digest1", at=AT)
DELETED = DeletionEntry(label="message-4d5e6f", key="salt:digest2", cause="deleted", at=AT)
EDITED = DeletionEntry(label="message-7a8b9c", key="salt:digest3", cause="edited", at=AT)


def test_a_file_from_before_deletions_were_journaled_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "forget-journal.json"
    old = {
        "format": WHOLE_FILE_FORMAT,
        "about": "…",
        "forgotten": [FORGOTTEN.model_dump(mode="json")],
    }
    path.write_text(json.dumps(old))
    journal = ForgetJournal(path)
    assert journal.entries() == [FORGOTTEN]
    assert journal.deletions() == []
    journal.add_all([DELETED])
    assert journal.entries() == [FORGOTTEN]  # the forget-me kept when the file is rewritten
    assert journal.deletions() == [DELETED]
    header, *entries = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(header)["format"] == FORMAT  # now one entry a line
    assert [next(iter(json.loads(line))) for line in entries] == ["forgotten", "deleted"]
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_deletion_is_added_once_and_copied_with_the_forget_mes(tmp_path: Path) -> None:
    here = ForgetJournal(tmp_path / "here.json")
    here.add_all([DELETED])
    here.add_all([DELETED, EDITED])  # a platform's retry: the label is the identity
    assert here.deletions() == [DELETED, EDITED]
    here.add_all([FORGOTTEN])
    there = ForgetJournal(tmp_path / "there.json")
    there.add_all([EDITED])
    here.copy_to(there)
    assert there.entries() == [FORGOTTEN]
    assert there.deletions() == [EDITED, DELETED]
    assert (tmp_path / "there.json").stat().st_mode & 0o777 == 0o600


def test_an_entry_is_appended_and_the_lines_before_it_are_left_as_they_were(
    tmp_path: Path,
) -> None:
    """The file gains a line per message taken back, for good: adding one must not
    rewrite (or parse) the thousands before it."""
    path = tmp_path / "forget-journal.json"
    journal = ForgetJournal(path)
    many = [
        DeletionEntry(label=f"message-{i:06x}", key=f"salt:{i}", cause="deleted", at=AT)
        for i in range(2000)
    ]
    journal.add_all(many)
    before = path.read_bytes()
    inode = path.stat().st_ino
    journal.add_all([EDITED])
    after = path.read_bytes()
    assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1
    assert path.stat().st_ino == inode  # the same file, not a new one renamed over it
    assert journal.deletions() == [*many, EDITED]


def test_an_entry_a_crash_cut_short_is_left_out_and_cut_off_before_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "forget-journal.json"
    journal = ForgetJournal(path)
    journal.add_all([DELETED])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"deleted": {"label": "message-')  # the crash
    assert journal.deletions() == [DELETED]
    assert "cut short" in caplog.text
    journal.add_all([FORGOTTEN])
    added = json.dumps({"forgotten": FORGOTTEN.model_dump(mode="json")}) + "\n"
    assert path.read_bytes() == whole + added.encode()  # the torn bytes are gone
    assert journal.entries() == [FORGOTTEN]
    assert journal.deletions() == [DELETED]


def test_a_damaged_line_inside_the_file_is_an_error_not_a_forgotten_entry(
    tmp_path: Path,
) -> None:
    """Only the last line can be cut short by a crash; a bad line before it is damage,
    and reading on would silently lose a forget-me."""
    path = tmp_path / "forget-journal.json"
    journal = ForgetJournal(path)
    journal.add_all([FORGOTTEN])
    journal.add_all([DELETED])
    header, forgotten, deleted = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([header, forgotten[:-5], deleted]) + "\n", encoding="utf-8")
    with pytest.raises(ForgetJournalError, match="damaged"):
        journal.entries()
    path.write_text("\n".join([header, '{"forgotten": {"pseudonym": 1}}', deleted]) + "\n")
    with pytest.raises(ForgetJournalError, match="1 bad entries"):
        journal.deletions()


async def test_a_file_that_cannot_be_written_is_logged_and_does_not_stop_the_caller(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's journal has the forget-me or deletion; the file failing must not
    stop it, but the operator must learn what a restore would then get wrong."""
    blocked = tmp_path / "forget-journal.json"
    blocked.mkdir()  # a directory where the file should be
    await ForgetJournal(blocked).record([DELETED, FORGOTTEN], "would bring this message back")
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "message-4d5e6f, member-1a2b3c" in record.getMessage()
    assert "would bring this message back" in record.getMessage()
