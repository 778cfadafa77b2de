"""The bot's fast all-MiniLM-L6-v2 embeddings for Chroma, and the process-wide Chroma client.

Why this module exists:

* The model itself is built offline from the bundled weights by the engine
  (`sonality.memory.embedding`, re-exported here); this module makes it fast. The stock
  function pads every batch to 256 tokens. Chat messages and summaries are mostly far
  shorter, so almost all of that work is wasted; padding each batch only to its longest
  text gives the same vectors (padding is masked out) many times faster.
* The bot embeds two texts per message (the reply's query, the new memory's summary),
  and with many communities talking the model is the biggest single share of the
  process's CPU. By default it runs an int8 copy of the model (`ensure_minilm_int8`,
  quantized offline from the float graph): about half the CPU per text, 50 MB less
  memory, vectors close to the float model's (cosine at least 0.98) and the same
  recall on the project's retrieval evaluation. Measurements: docs/performance.md.
* Chroma wants one client per persist path per process, and the bot hosts two
  collections per community, so clients are cached per resolved path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import chromadb
import numpy as np
import numpy.typing as npt
from chromadb.api import ClientAPI
from chromadb.api.client import Client as ChromaClient
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.config import Settings
from chromadb.utils.embedding_functions import register_embedding_function

from sonality.memory.embedding import (
    HIDDEN,
    MAX_TOKENS,
    ONNX_FILES,
    BundledMiniLM,
    build_bert_onnx,
    ensure_minilm_onnx,
    read_safetensors,
    source_model_dir,
)
from sonality.memory.freed_memory import scrub_freed_memory

__all__ = [
    "INT8_MODEL",
    "ONNX_FILES",
    "PASS_TOKENS",
    "FastMiniLML6V2",
    "build_bert_onnx",
    "close_chroma_client",
    "default_embedding_function",
    "ensure_minilm_int8",
    "ensure_minilm_onnx",
    "make_chroma_client",
    "read_safetensors",
    "similar_length_runs",
    "source_model_dir",
]


log = logging.getLogger(__name__)

#: The int8 copy of the model, beside the float `model.onnx` it is made from.
INT8_MODEL = "model-int8.onnx"


# --------------------------------------------------------------------------------------
# The int8 model
# --------------------------------------------------------------------------------------


def ensure_minilm_int8(cache_dir: Path) -> Path:
    """Make sure the model directory (see `ensure_minilm_onnx`) also holds the int8 copy
    of the model, quantizing it from the float graph if missing; returns the directory.

    Dynamic quantization with one scale per output channel: weights are stored as int8
    and activations quantized on the fly, so no calibration data is needed. A scale per
    tensor instead moved vectors much further from the float model's (cosine down to
    0.93 on the retrieval evaluation's texts, against 0.98). The copy is written to a
    temporary file and renamed into place, so a reader never sees half of it; two
    processes quantizing at once write the same bytes.
    """
    onnx_dir = ensure_minilm_onnx(cache_dir)
    target = onnx_dir / INT8_MODEL
    if target.is_file():
        return onnx_dir
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fd, name = tempfile.mkstemp(prefix=".int8-build-", suffix=".onnx", dir=onnx_dir)
    os.close(fd)
    built = Path(name)
    try:
        with _without_quantizer_advice():
            quantize_dynamic(
                onnx_dir / "model.onnx", built, weight_type=QuantType.QInt8, per_channel=True
            )
        with built.open("rb") as fh:
            os.fsync(fh.fileno())
        built.chmod(0o644)  # mkstemp makes it private; the cache is shared read-only
        built.replace(target)
    finally:
        built.unlink(missing_ok=True)
    log.info("built the int8 all-MiniLM-L6-v2 model in %s", target)
    return onnx_dir


class _QuantizerAdvice(logging.Filter):
    """ONNX Runtime's quantizer advises pre-processing on the root logger; the graph is
    built here for inference already, so the advice is noise in the bot's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname or "pre-process" not in record.getMessage()


@contextlib.contextmanager
def _without_quantizer_advice() -> Iterator[None]:
    root = logging.getLogger()
    quiet = _QuantizerAdvice()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


# --------------------------------------------------------------------------------------
# The embedding function
# --------------------------------------------------------------------------------------


@register_embedding_function
class FastMiniLML6V2(BundledMiniLM):
    """The engine's offline MiniLM function, padded per batch instead of to 256 tokens.

    Vectors match the stock function (same graph, same mean pooling and normalisation);
    only wasted padding work is gone. Texts are sorted by length before batching so each
    batch pads to a similar length. The tokenizer and ONNX session are loaded lazily,
    once, under a lock: Chroma builds embedding functions from persisted config just to
    check them, and that must not cost a model load. ``__call__`` is thread-safe
    (ONNX Runtime sessions allow concurrent ``run``).

    Registered under its own name so a persisted collection records which function made
    its vectors and Chroma can rebuild it from ``get_config()`` when reopened. With
    ``quantized``, it runs the int8 copy of the model (see `ensure_minilm_int8`) under
    the same name: Chroma refuses to open a collection with a function of another name,
    and the two models' vectors are close enough to rank together, so collections
    written by either are read by both. The int8 model quantizes a pass's activations
    with one scale for the whole pass, so a text's vector moves a little with what it
    is batched (and padded) with: cosine 0.986 or more against the same text alone,
    0.992 on average. Embedding each text alone instead kept vectors exact but gave up
    most of the saving (2.7 ms per text alone, 1.4–1.6 ms in the lane's batches).
    """

    def __init__(
        self, cache_dir: str | Path, batch_size: int = 32, *, quantized: bool = False
    ) -> None:
        super().__init__(cache_dir)
        self.quantized = quantized
        self._batch_size = max(1, int(batch_size))
        self._load_lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None

    # -- loading -----------------------------------------------------------------------

    def _load(self) -> tuple[Any, Any]:
        loaded = self._loaded
        if loaded is not None:
            return loaded
        with self._load_lock:
            if self._loaded is None:
                onnx_dir, model = self._model_file()
                tokenizer = self.Tokenizer.from_file(str(onnx_dir / "tokenizer.json"))
                tokenizer.enable_truncation(max_length=MAX_TOKENS)
                tokenizer.no_padding()  # we pad per batch ourselves
                options = self.ort.SessionOptions()
                options.log_severity_level = 3
                # One thread per inference: replies and background learning embed at the
                # same time, and two sessions each spreading over every core thrash
                # (measured: 7 ms per query alone vs 15 ms with the default pool).
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                # No arena: ONNX Runtime's keeps the peak of any pass for good (a burst of
                # long texts left the process 418 MB larger), and without it chat-sized
                # texts cost the same CPU (2.66 vs 2.69 ms per text in batches of 32).
                options.enable_cpu_mem_arena = False
                options.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                session = self.ort.InferenceSession(
                    str(model),
                    sess_options=options,
                    providers=["CPUExecutionProvider"],
                )
                self._loaded = (tokenizer, session)
            return self._loaded

    def _model_file(self) -> tuple[Path, Path]:
        """The model directory and the graph to run: the int8 copy when `quantized`,
        unless it cannot be built (a read-only cache without it), then the float one."""
        if self.quantized:
            try:
                onnx_dir = ensure_minilm_int8(self._cache_dir)
                return onnx_dir, onnx_dir / INT8_MODEL
            except OSError as exc:
                log.warning(
                    "could not build the int8 embedding model in %s (%s); using the float "
                    "model, which is slower",
                    self._cache_dir,
                    exc,
                )
        onnx_dir = ensure_minilm_onnx(self._cache_dir)
        return onnx_dir, onnx_dir / "model.onnx"

    @property
    def tokenizer(self) -> Any:
        return self._load()[0]

    @property
    def model(self) -> Any:
        return self._load()[1]

    # -- embedding ---------------------------------------------------------------------

    def _forward(
        self, documents: list[str], batch_size: int | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed documents, padding each (length-sorted) batch only to its longest text."""
        tokenizer, session = self._load()
        if not documents:
            return np.zeros((0, HIDDEN), dtype=np.float32)
        encoded = [tokenizer.encode(doc) for doc in documents]
        lengths = np.array([len(e.ids) for e in encoded])
        order = np.argsort(lengths, kind="stable")
        size = batch_size or self._batch_size
        out = np.empty((len(documents), HIDDEN), dtype=np.float32)
        for idx in similar_length_runs(order, lengths, size):
            width = int(lengths[idx].max())
            input_ids = np.zeros((len(idx), width), dtype=np.int64)
            attention_mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, doc_index in enumerate(idx):
                enc = encoded[doc_index]
                input_ids[row, : len(enc.ids)] = enc.ids
                attention_mask[row, : len(enc.ids)] = enc.attention_mask
            (hidden,) = session.run(
                ["last_hidden_state"],
                {
                    "input_ids": input_ids,
                    "attention_mask": attention_mask,
                    "token_type_ids": np.zeros_like(input_ids),
                },
            )
            # Mean pooling + L2 normalisation done exactly as the stock function does
            # (int64 mask promotes to float64, torch's 1e-12 epsilon), so vectors match.
            expanded = np.broadcast_to(np.expand_dims(attention_mask, -1), hidden.shape)
            pooled = np.sum(hidden * expanded, 1) / np.clip(expanded.sum(1), a_min=1e-9, a_max=None)
            out[idx] = self._normalize(pooled).astype(np.float32)
        return out

    def __call__(self, input: Documents) -> Embeddings:
        vectors = self._forward(list(input))
        return cast(Embeddings, list(vectors))

    # -- Chroma configuration protocol -------------------------------------------------

    @staticmethod
    def name() -> str:
        return "sonality_minilm_l6_v2"

    def default_space(self) -> Space:
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        return {"cache_dir": str(self._cache_dir), "quantized": self.quantized}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> EmbeddingFunction[Documents]:
        """The shared instance; other keys (older configs) are ignored, and a config
        from before the int8 model means the float one."""
        FastMiniLML6V2.validate_config(config)
        quantized = bool(config.get("quantized", False))
        return default_embedding_function(Path(config["cache_dir"]), quantized=quantized)

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        if not isinstance(config.get("cache_dir"), str):
            raise ValueError("sonality_minilm_l6_v2 config needs a 'cache_dir' string")

    def validate_config_update(
        self, old_config: dict[str, Any], new_config: dict[str, Any]
    ) -> None:
        """Neither the cache location nor the int8 model moves vectors out of the
        space the collection ranks in, so any update is fine."""
        self.validate_config({**old_config, **new_config})


#: The most padded tokens one pass embeds: 8 texts of the longest kind (256 tokens), 32
#: chat-sized ones. Splitting long texts costs no CPU (their pass time grows with length,
#: not with batching) and bounds a pass to tens of megabytes.
PASS_TOKENS = 2048


def similar_length_runs(
    order: npt.NDArray[np.intp], lengths: npt.NDArray[np.int_], size: int
) -> Iterator[npt.NDArray[np.intp]]:
    """Split length-sorted indexes into runs of at most `size` whose longest text is at
    most twice the shortest (plus a few tokens): one long message in a batch must not
    pad every short one to its length. A run also holds at most `PASS_TOKENS` padded
    tokens, because a pass's memory grows with texts × length²: 32 texts of 256 tokens
    took 418 MB."""
    start = 0
    while start < len(order):
        limit = 2 * int(lengths[order[start]]) + 8
        end = start + 1
        while (
            end < len(order)
            and end - start < size
            and lengths[order[end]] <= limit
            and (end - start + 1) * int(lengths[order[end]]) <= PASS_TOKENS
        ):
            end += 1
        yield order[start:end]
        start = end


_ef_lock = threading.Lock()
_ef_cache: dict[tuple[Path, bool], FastMiniLML6V2] = {}


def default_embedding_function(cache_dir: Path, *, quantized: bool = False) -> FastMiniLML6V2:
    """One shared instance per cache dir and model, so each loads once per process."""
    key = (Path(cache_dir).resolve(), quantized)
    with _ef_lock:
        ef = _ef_cache.get(key)
        if ef is None:
            ef = _ef_cache[key] = FastMiniLML6V2(key[0], quantized=quantized)
        return ef


# --------------------------------------------------------------------------------------
# Chroma client
# --------------------------------------------------------------------------------------

_client_lock = threading.Lock()
_clients: dict[Path, ClientAPI] = {}


def make_chroma_client(persist_dir: Path) -> ClientAPI:
    """Return the process's PersistentClient for ``persist_dir`` (created on first use).

    Chroma keeps one system per path per process and rejects a second one with
    different settings, so clients are cached by resolved path. Telemetry is off (the
    bot runs offline). Chroma's memory settings (``chroma_memory_limit_bytes``, the LRU
    segment cache) are not passed: the Rust bindings ignore them. See
    ``chroma_memory.shared_chroma`` for how the bot bounds Chroma's memory instead.
    """
    key = Path(persist_dir).resolve()
    with _client_lock:
        client = _clients.get(key)
        if client is None:
            key.mkdir(parents=True, exist_ok=True)
            scrub_freed_memory()  # before the index holds a buffer: see that module
            client = chromadb.PersistentClient(
                path=str(key), settings=Settings(anonymized_telemetry=False)
            )
            _clients[key] = client
        return client


def close_chroma_client(persist_dir: Path) -> None:
    """Forget and close the cached client for a path (shutdown, tests, moving data)."""
    key = Path(persist_dir).resolve()
    with _client_lock:
        cached = _clients.pop(key, None)
    if isinstance(cached, ChromaClient):  # the concrete client is what has close()
        cached.close()
