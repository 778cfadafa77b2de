"""The locally built MiniLM model: correct weights, correct graph, stock-identical vectors;
and its int8 copy, close to it."""

from __future__ import annotations

import json
import math
import shutil
import struct
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from chromadb.utils.embedding_functions.onnx_mini_lm_l6_v2 import ONNXMiniLM_L6_V2

from chroma_memory import embedding as chroma_embedding
from chroma_memory.embedding import (
    INT8_MODEL,
    ONNX_FILES,
    FastMiniLML6V2,
    close_chroma_client,
    default_embedding_function,
    ensure_minilm_int8,
    ensure_minilm_onnx,
    make_chroma_client,
    read_safetensors,
    source_model_dir,
)
from sonality.memory import embedding as emb  # where the model is built

SENTENCES = [
    "Nuclear power plants are a safe, low-carbon source of electricity.",
    "hi",
    "Sourdough needs a long, cold fermentation — and patience! 🍞",
    "A progressive income tax with fewer loopholes is fairer than a flat tax, "
    "because it asks more of those who can most afford it.",
    " ".join(["The committee debated the energy budget at considerable length."] * 40),
]


def _no_download(*_: Any, **__: Any) -> None:
    raise AssertionError("the model must never be downloaded")


# -- safetensors ------------------------------------------------------------------------


def _write_safetensors(
    path: Path, tensors: dict[str, npt.NDArray[Any]], codes: dict[str, str]
) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blob = b""
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {
            "dtype": codes[name],
            "shape": list(arr.shape),
            "data_offsets": [len(blob), len(blob) + len(raw)],
        }
        blob += raw
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + blob)


def test_read_safetensors_round_trips_values(tmp_path: Path) -> None:
    weights = np.arange(12, dtype="<f4").reshape(3, 4) / 7
    ids = np.array([[0, 1, 2]], dtype="<i8")
    path = tmp_path / "t.safetensors"
    _write_safetensors(path, {"w": weights, "ids": ids}, {"w": "F32", "ids": "I64"})
    got = read_safetensors(path)
    assert set(got) == {"w", "ids"}
    np.testing.assert_array_equal(got["w"], weights)
    np.testing.assert_array_equal(got["ids"], ids)
    assert got["w"].dtype == np.float32


def test_read_safetensors_rejects_inconsistent_offsets(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(ValueError, match="inconsistent"):
        read_safetensors(path)


def test_bundled_weights_have_minilm_geometry() -> None:
    weights = read_safetensors(source_model_dir() / "model.safetensors")
    assert weights["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert weights["encoder.layer.5.intermediate.dense.weight"].shape == (1536, 384)
    assert not any(k.startswith("encoder.layer.6.") for k in weights)


# -- building ---------------------------------------------------------------------------


def test_build_is_complete_atomic_and_happens_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[int] = []
    real_build = emb.build_bert_onnx

    def counting_build(weights: dict[str, npt.NDArray[Any]]) -> Any:
        builds.append(1)
        return real_build(weights)

    monkeypatch.setattr(emb, "build_bert_onnx", counting_build)
    cache = tmp_path / "models"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_minilm_onnx(cache))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    onnx_dir = cache / "onnx"
    assert results == [onnx_dir.resolve()] * 3
    assert len(builds) == 1, "concurrent callers must wait for one build, not race"
    assert sorted(p.name for p in onnx_dir.iterdir()) == sorted(ONNX_FILES)
    assert not [p for p in cache.iterdir() if p.name.startswith(".onnx-")], "temp dir left"

    # A damaged cache (a file missing) is rebuilt, crash leftovers are swept away,
    # and a complete cache is left alone.
    (onnx_dir / "vocab.txt").unlink()
    (cache / ".onnx-build-crashed").mkdir()
    ensure_minilm_onnx(cache)
    assert (onnx_dir / "vocab.txt").is_file() and len(builds) == 2
    assert not (cache / ".onnx-build-crashed").exists()
    ensure_minilm_onnx(cache)
    assert len(builds) == 2


def test_onnx_graph_matches_numpy_reference_bert(embedding_function: FastMiniLML6V2) -> None:
    """The graph is checked against an independent float64 BERT forward pass."""
    w = read_safetensors(source_model_dir() / "model.safetensors")
    f = {k: np.asarray(v, dtype=np.float64) for k, v in w.items() if v.dtype == np.float32}
    ids = np.array(embedding_function.tokenizer.encode("Atomic energy is contested.").ids)

    def ln(x: npt.NDArray[np.float64], p: str) -> npt.NDArray[np.float64]:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * f[f"{p}.weight"] + f[f"{p}.bias"]

    def lin(x: npt.NDArray[np.float64], p: str) -> npt.NDArray[np.float64]:
        return x @ f[f"{p}.weight"].T + f[f"{p}.bias"]

    erf = np.vectorize(math.erf)
    s = len(ids)
    x = f["embeddings.word_embeddings.weight"][ids] + f["embeddings.position_embeddings.weight"][:s]
    x = ln(x + f["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    for i in range(6):
        p = f"encoder.layer.{i}"
        heads = [
            lin(x, f"{p}.attention.self.{n}").reshape(s, 12, 32).transpose(1, 0, 2)
            for n in ("query", "key", "value")
        ]
        q, k, v = heads
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(s, 384)
        x = ln(lin(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
        h = lin(x, f"{p}.intermediate.dense")
        x = ln(
            lin(0.5 * h * (1 + erf(h / math.sqrt(2))), f"{p}.output.dense") + x,
            f"{p}.output.LayerNorm",
        )

    (onnx_out,) = embedding_function.model.run(
        ["last_hidden_state"],
        {
            "input_ids": ids[None, :].astype(np.int64),
            "attention_mask": np.ones((1, s), dtype=np.int64),
            "token_type_ids": np.zeros((1, s), dtype=np.int64),
        },
    )
    assert onnx_out.shape == (1, s, 384)
    np.testing.assert_allclose(onnx_out[0], x, atol=1e-4)


def test_sentence_transformers_reference_similarities(embedding_function: FastMiniLML6V2) -> None:
    """The similarity matrix the sentence-transformers docs print for all-MiniLM-L6-v2."""
    v = np.array(
        embedding_function(
            ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
        )
    )
    sims = v @ v.T
    assert sims[0, 1] == pytest.approx(0.6660, abs=1e-3)
    assert sims[0, 2] == pytest.approx(0.1046, abs=1e-3)
    assert sims[1, 2] == pytest.approx(0.1411, abs=1e-3)


# -- the embedding function ---------------------------------------------------------------


def test_vectors_identical_to_stock_function(
    embedding_function: FastMiniLML6V2, model_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ONNXMiniLM_L6_V2, "_download", _no_download)
    stock = ONNXMiniLM_L6_V2()
    stock.DOWNLOAD_PATH = model_cache_dir
    expected = np.array(stock(SENTENCES))
    got = np.array(embedding_function(SENTENCES))
    assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # Alone or in a batch with a long text, a vector does not change.
    alone = np.array(embedding_function([SENTENCES[1]]))[0]
    np.testing.assert_allclose(alone, expected[1], atol=1e-5, rtol=0)


def test_batches_are_padded_only_to_their_longest_text(model_cache_dir: Path) -> None:
    ef = FastMiniLML6V2(model_cache_dir, batch_size=2)
    tokenizer, session = ef._load()
    widths: list[int] = []

    class SpySession:
        def run(self, names: list[str], feeds: dict[str, npt.NDArray[np.int64]]) -> Any:
            widths.append(feeds["input_ids"].shape[1])
            return session.run(names, feeds)

    ef._loaded = (tokenizer, SpySession())
    texts = ["a b c d e f g h", "hi", "one two", "x"]
    ef(texts)
    lengths = sorted(len(tokenizer.encode(t).ids) for t in texts)
    # Length-sorted batches of two: the short pair, then the long pair.
    assert widths == [lengths[1], lengths[3]]
    assert max(widths) < 256


def test_empty_input_gives_no_vectors(embedding_function: FastMiniLML6V2) -> None:
    assert embedding_function._forward([]).shape == (0, 384)


def test_default_embedding_function_is_shared_per_dir(
    model_cache_dir: Path, tmp_path: Path
) -> None:
    a = default_embedding_function(model_cache_dir)
    assert default_embedding_function(model_cache_dir / ".." / model_cache_dir.name) is a
    assert default_embedding_function(tmp_path / "other") is not a


def test_config_round_trip_and_not_legacy(embedding_function: FastMiniLML6V2) -> None:
    config = embedding_function.get_config()
    assert json.loads(json.dumps(config)) == config
    assert FastMiniLML6V2.build_from_config(config) is embedding_function
    assert not embedding_function.is_legacy()
    assert embedding_function.default_space() == "cosine"
    with pytest.raises(ValueError):
        FastMiniLML6V2.validate_config({"preferred_providers": None})


def test_chroma_accepts_and_reopens_collection_without_warnings(
    embedding_function: FastMiniLML6V2, persist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ONNXMiniLM_L6_V2, "_download", _no_download)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client = make_chroma_client(persist_dir)
        col = client.get_or_create_collection(
            "probe",
            embedding_function=embedding_function,  # type: ignore[arg-type]
            configuration={"hnsw": {"space": "cosine"}},
        )
        col.add(ids=["n"], documents=[SENTENCES[0]])
        ef_json = col.configuration_json["embedding_function"]
        assert ef_json["name"] == FastMiniLML6V2.name()
        assert col.configuration_json["hnsw"]["space"] == "cosine"

        again = client.get_or_create_collection(
            "probe",
            embedding_function=embedding_function,  # type: ignore[arg-type]
        )
        # Without an explicit function Chroma rebuilds ours from the persisted config.
        bare = client.get_collection("probe")
        for c in (again, bare):
            res = c.query(query_texts=["Is atomic energy dangerous?"], n_results=1)
            assert res["ids"] == [["n"]]
            assert 1 - res["distances"][0][0] > 0.3  # type: ignore[index]


# -- client -------------------------------------------------------------------------------


def test_client_is_cached_per_resolved_path(persist_dir: Path) -> None:
    client = make_chroma_client(persist_dir)
    assert make_chroma_client(persist_dir / ".." / persist_dir.name) is client
    assert client.get_settings().anonymized_telemetry is False


def test_closed_client_is_replaced(persist_dir: Path) -> None:
    first = make_chroma_client(persist_dir)
    close_chroma_client(persist_dir)
    assert make_chroma_client(persist_dir) is not first


# -- the int8 model (the bot's default, SONALITY_EMBEDDING_INT8) ---------------------------

RETRIEVAL_TEXTS = Path(__file__).parent / "data" / "retrieval_space.json"


def _evaluation_texts() -> list[str]:
    raw = json.loads(RETRIEVAL_TEXTS.read_text(encoding="utf-8"))
    return [
        *(e["summary"] for e in raw["episodes"]),
        *(e["message"] for e in raw["episodes"]),
        *(q["text"] for q in raw["queries"]),
        *SENTENCES,
    ]


def test_int8_vectors_are_close_to_the_float_models(
    embedding_function: FastMiniLML6V2, int8_embedding_function: FastMiniLML6V2
) -> None:
    """Measured over these 121 texts when the int8 model was made (2026-11-27): cosine
    with the float model's vector at least 0.984, mean 0.994 (a scale per tensor instead
    of per channel gave 0.934 and 0.966). Recall: tests/memory/test_retrieval_space.py."""
    texts = _evaluation_texts()
    exact = np.asarray(embedding_function(texts))
    quick = np.asarray(int8_embedding_function(texts))
    assert quick.shape == exact.shape == (len(texts), 384) and quick.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(quick, axis=1), 1.0, atol=1e-5)
    cosine = (exact * quick).sum(axis=1)
    assert cosine.min() > 0.98, texts[int(cosine.argmin())]
    assert cosine.mean() > 0.99
    assert cosine.max() < 0.99999  # it is the int8 model, not the float one again


def test_int8_model_is_quantized_once_beside_the_float_one(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    import onnx

    cache = tmp_path / "models"
    shutil.copytree(model_cache_dir / "onnx", cache / "onnx")  # the float model, built
    (cache / "onnx" / INT8_MODEL).unlink(missing_ok=True)
    onnx_dir = ensure_minilm_int8(cache)
    built = onnx_dir / INT8_MODEL
    graph = onnx.load(str(built)).graph
    bytes_ = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    weights = [t for t in graph.initializer if t.data_type in bytes_]
    # The word embeddings (11.7 M) and every layer's weights (10.6 M) take a byte each.
    assert sum(math.prod(t.dims) for t in weights) > 22_000_000
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= {n.op_type for n in graph.node}
    assert built.stat().st_size < (onnx_dir / "model.onnx").stat().st_size / 3
    assert sorted(p.name for p in onnx_dir.iterdir()) == sorted([*ONNX_FILES, INT8_MODEL])
    before = built.stat().st_mtime_ns
    ensure_minilm_int8(cache)
    assert built.stat().st_mtime_ns == before  # built once
    ef = FastMiniLML6V2(cache, quantized=True)
    assert ef.model._model_path == str(built)


def test_without_the_int8_model_the_float_one_runs_and_the_log_says_why(
    model_cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache the bot may not write to (an image built before the int8 model)."""

    def read_only(_: Path) -> Path:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(chroma_embedding, "ensure_minilm_int8", read_only)
    ef = FastMiniLML6V2(model_cache_dir, quantized=True)
    with caplog.at_level("WARNING", logger="chroma_memory.embedding"):
        assert ef.model._model_path == str(model_cache_dir.resolve() / "onnx" / "model.onnx")
    assert "could not build the int8 embedding model" in caplog.text
    assert "read-only file system" in caplog.text


def test_int8_config_round_trip(int8_embedding_function: FastMiniLML6V2) -> None:
    """Chroma rebuilds the function from a collection's config: the same model again,
    and a config from before the int8 model means the float one."""
    config = int8_embedding_function.get_config()
    assert config["quantized"] is True
    assert FastMiniLML6V2.build_from_config(config) is int8_embedding_function
    older = FastMiniLML6V2.build_from_config({"cache_dir": config["cache_dir"]})
    assert isinstance(older, FastMiniLML6V2) and not older.quantized
    assert int8_embedding_function.name() == older.name()  # one name: either opens both


def test_an_int8_vector_moves_only_a_little_with_its_batch(
    int8_embedding_function: FastMiniLML6V2,
) -> None:
    """The int8 model quantizes a pass's activations with one scale for the whole pass,
    so a text's vector depends a little on its batch companions and their padding:
    measured at cosine 0.986 or more against the same text alone (2026-11-27). Alone,
    a text always gets the same vector."""
    texts = _evaluation_texts()[:40]
    alone = np.asarray([int8_embedding_function([text])[0] for text in texts])
    np.testing.assert_array_equal(alone[0], np.asarray(int8_embedding_function([texts[0]])[0]))
    together = np.asarray(int8_embedding_function(texts))
    with_a_long_one = np.asarray(int8_embedding_function([texts[0], SENTENCES[-1]]))[0]
    moved = (alone * together).sum(axis=1)
    assert moved.min() > 0.98
    assert float(alone[0] @ with_a_long_one) > 0.98
