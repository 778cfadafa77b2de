"""`python3 scripts/run.py index-chroma-log PATH` on a running Chroma server's directory:
the index is made, the server goes on answering and writing, a wrong path is one line."""

from __future__ import annotations

from pathlib import Path

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings as ChromaSettings

from app.chroma_log_command import COMMAND, run_command
from app.cli import parse_args
from storage.chroma_log import LOG_INDEX
from tests.chroma_server import running_chroma_server
from tests.memory.test_chroma_log_index import CHROMA_LOG_PURGE, CHROMA_LOG_READ, plan


def vectors(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 384)).astype(np.float32)


def test_a_running_servers_log_is_indexed_and_the_server_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chroma"
    with running_chroma_server(path) as server:
        host, port = server.url.removeprefix("http://").split(":")
        client = chromadb.HttpClient(
            host=host, port=int(port), settings=ChromaSettings(anonymized_telemetry=False)
        )
        collection = client.create_collection(
            "episodes-test", configuration={"hnsw": {"space": "cosine", "sync_threshold": 32}}
        )
        before = vectors(1, 3)
        collection.add(ids=["a", "b", "c"], embeddings=before, documents=["one", "two", "three"])
        database = path / "chroma.sqlite3"
        assert LOG_INDEX not in plan(database, CHROMA_LOG_READ, ("topic", 0, 2**62))

        assert run_command(parse_args([COMMAND, str(path)])) == 0
        assert "indexed by collection" in capsys.readouterr().out
        assert f"USING INDEX {LOG_INDEX}" in plan(database, CHROMA_LOG_READ, ("t", 0, 2**62))
        assert f"USING INDEX {LOG_INDEX}" in plan(database, CHROMA_LOG_PURGE, ("t", 0))
        assert run_command(parse_args([COMMAND, str(path)])) == 0  # again: nothing changes

        # The server, which had its statements prepared before, still writes and reads.
        after = vectors(2, 3)
        collection.add(ids=["d", "e", "f"], embeddings=after, documents=["four", "five", "six"])
        assert sorted(collection.get()["ids"]) == ["a", "b", "c", "d", "e", "f"]
        found = collection.query(query_embeddings=after[:1], n_results=1)
        assert found["ids"] == [["d"]]
        found = collection.query(query_embeddings=before[2:], n_results=1)
        assert found["ids"] == [["c"]]


def test_a_directory_without_chromas_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_command(parse_args([COMMAND, str(tmp_path)])) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"no chroma.sqlite3 in {tmp_path}" in err
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_chromas_is_left_alone_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = b"not a database, " * 512
    (tmp_path / "chroma.sqlite3").write_bytes(garbage)
    assert run_command(parse_args([COMMAND, str(tmp_path)])) == 1
    shown = capsys.readouterr()
    assert shown.out == ""
    assert "was left as it was" in shown.err
    assert (tmp_path / "chroma.sqlite3").read_bytes() == garbage
