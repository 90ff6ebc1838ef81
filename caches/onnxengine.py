"""The ONNX Runtime engine for a local sentence-transformers model: the model exported once per
machine, run fp32, and checked equal to torch before it serves.

Why: in the gateway's process torch hands the GIL back on every operator, and a busy event loop
holds it for up to the switch interval (5 ms) each time, so one prompt took several times as
long there as alone. ONNX Runtime runs the whole graph in one call without the GIL, with vectors
equal to torch's within 2e-7 (bench_gateway_semantic: gateway_semantic_load against torch;
docs/benchmarks.md, "The semantic lookup under load").
int8 (ORT's or torch's dynamic quantisation) drifted to cosine 0.91 / 0.86 against torch on
CLINC150: not used.

The export (torch.onnx's tracer over the whole model: transformer, pooling, normalisation) is
cached under `<cache dir>/onnx/<model>-<key>/model.onnx`, the key naming the model, its files
and the exporter (torch's version), so a clone, a venv or a restart reuses it; it is written to
a temporary name and renamed, so two processes exporting at once both end with a whole file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]

# Bump when the exported graph changes (inputs, outputs, opset), so old exports are not reused.
EXPORT_FORMAT: Final = 1
OPSET: Final = 17
# The largest difference of any component of ONNX's unit vector from torch's that still counts
# as equal. Measured: 2e-7 (fp32 on both); int8 drifts by ~0.1. So a mismatch of the export,
# the tokenizer or the runtime fails the check by orders of magnitude, not by chance.
TOLERANCE: Final = 1e-5
# Embedded by both engines at start; the last runs past the model's 256-token limit, so
# truncation is checked too.
PROBE_TEXTS: Final = (
    "what is my account balance",
    "Convert 30 degrees Celsius to Fahrenheit, please!",
    "book a table for two at 7pm tomorrow at an italian place near the office",
    "ok",
    "¿Cuál es la capital de Francia? 東京はどこですか",
    " ".join(["the quick brown fox jumps over the lazy dog"] * 40),
)
_INPUTS: Final = ("input_ids", "attention_mask", "token_type_ids")


class OnnxUnavailable(Exception):
    """The ONNX engine cannot serve this model here (said in one line; torch serves)."""


def export_dir(cache_dir: Path, model: str, model_path: str | None) -> Path:
    """Where this model's export lives: named by the model, keyed by its files and exporter."""
    import torch

    h = hashlib.sha256(f"{EXPORT_FORMAT}|{OPSET}|{torch.__version__}|{model}".encode())
    if model_path and Path(model_path).is_dir():
        for f in sorted(Path(model_path).rglob("*")):
            if f.is_file():
                h.update(f"|{f.relative_to(model_path)}:{f.stat().st_size}".encode())
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[-60:]
    return cache_dir / "onnx" / f"{name}-{h.hexdigest()[:12]}"


def export(st: Any, features: dict[str, Any], path: Path) -> None:
    """Trace `st` (a SentenceTransformer) whole into an ONNX file at `path` (atomically):
    inputs as its tokenizer gives them, output the sentence embedding."""
    import torch

    names = [k for k in _INPUTS if k in features]

    class Whole(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.st = st

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.st(dict(zip(names, tensors, strict=True)))[
                "sentence_embedding"
            ]
            return out

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".onnx", dir=path.parent)
    os.close(fd)
    axes: dict[str, dict[int, str]] = {k: {0: "batch", 1: "tokens"} for k in names}
    axes["sentence_embedding"] = {0: "batch"}
    t0 = time.monotonic()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notes on shapes it keeps dynamic
            torch.onnx.export(
                Whole().eval(), tuple(features[k] for k in names), tmp,
                input_names=names, output_names=["sentence_embedding"],
                dynamic_axes=axes,
                opset_version=OPSET, dynamo=False,
            )  # fmt: skip
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared by every checkout
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    log.info("exported the embedding model to ONNX in %.1f s: %s", time.monotonic() - t0, path)


class OnnxRunner:
    """One ONNX Runtime session over an exported model: tokenizer features in, unit vectors out.

    `threads`: ORT's intra-op threads (1 on a busy 2-core box, as for torch: see
    DEFAULT_TORCH_THREADS in embedders.py); its worker threads never spin waiting for work."""

    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3  # errors only: its notes on the graph are noise in a log
        self._sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self._sess.get_inputs()]

    def run(self, features: dict[str, Any]) -> Vectors:
        feed = {k: np.asarray(features[k], dtype=np.int64) for k in self.inputs}
        out = np.asarray(self._sess.run(None, feed)[0], dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        unit: Vectors = out / norms
        return unit


def numpy_features(features: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer's tensors as numpy arrays (what ORT takes), other entries dropped."""
    return {k: v.numpy() for k, v in features.items() if k in _INPUTS}


def largest_difference(a: Vectors, b: Vectors) -> float:
    return float(np.abs(a - b).max()) if a.size else 0.0


def load(
    st: Any, torch_embed: Any, cache_dir: Path, model: str, model_path: str | None, threads: int
) -> OnnxRunner:
    """The ONNX engine for `st`, exported if this machine has none yet, checked equal to
    `torch_embed` (texts -> unit vectors) on PROBE_TEXTS. An export found in the cache that
    fails to load or to match is made again, once. Raises OnnxUnavailable saying why
    (onnxruntime missing, export failed, vectors differ)."""
    try:
        import onnxruntime  # noqa: F401  # the one import that may fail on a platform
    except ImportError as e:
        raise OnnxUnavailable(f"onnxruntime cannot load ({e})") from None
    path = export_dir(cache_dir, model, model_path) / "model.onnx"
    want = torch_embed(list(PROBE_TEXTS))
    features = numpy_features(st.preprocess(list(PROBE_TEXTS)))
    fresh = not path.exists()
    if fresh:
        _export(st, path)
    problem = _check(path, threads, features, want)
    if isinstance(problem, str) and not fresh:
        log.info("the cached ONNX export does not serve (%s): exporting again", problem)
        _export(st, path)
        problem = _check(path, threads, features, want)
    if isinstance(problem, str):
        raise OnnxUnavailable(problem)
    return problem


def _export(st: Any, path: Path) -> None:
    try:
        export(st, st.preprocess(list(PROBE_TEXTS[:2])), path)
    except Exception as e:  # torch's exporter raises many kinds; one line says which
        raise OnnxUnavailable(f"export to ONNX failed: {type(e).__name__}: {e}") from e


def _check(path: Path, threads: int, features: dict[str, Any], want: Vectors) -> OnnxRunner | str:
    """A runner on `path` whose vectors equal `want`, else what is wrong."""
    try:
        runner = OnnxRunner(path, threads)
        diff = largest_difference(runner.run(features), want)
    except Exception as e:  # a truncated or foreign file: ORT's errors name no common class
        return f"ONNX Runtime cannot run {path}: {type(e).__name__}: {e}"
    if diff > TOLERANCE:
        return f"ONNX vectors differ from torch's by {diff:.2g} (> {TOLERANCE:g}) on probe texts"
    return runner


# Texts an ORT call takes at most, as sentence-transformers' encode batches (64): one call on
# every text of a large caller (an eval's 20,000 utterances) padded them all to the longest
# and held every layer's activations at once, past 20 GB.
CHUNK_TEXTS = 64


def embed(runner: OnnxRunner, st: Any, texts: Sequence[str]) -> Vectors:
    """Tokenise as sentence-transformers does (its own preprocess), then one ORT call a chunk
    of at most CHUNK_TEXTS, longest first as encode sorts them (so a chunk pads little); the
    vectors come back in the callers' order."""
    items = list(texts)
    if len(items) <= CHUNK_TEXTS:
        return runner.run(numpy_features(st.preprocess(items)))
    order = sorted(range(len(items)), key=lambda i: -len(items[i]))
    parts = [
        runner.run(numpy_features(st.preprocess([items[i] for i in order[k : k + CHUNK_TEXTS]])))
        for k in range(0, len(order), CHUNK_TEXTS)
    ]
    out = np.empty((len(items), parts[0].shape[1]), dtype=np.float32)
    out[order] = np.concatenate(parts)
    return out
