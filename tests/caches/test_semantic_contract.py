"""One contract, every semantic store: Qdrant Edge and the qdrant-client server path."""

from __future__ import annotations

import time

import numpy as np
import pytest

from caches.keys import Namespace
from caches.semantic.base import SemanticPoint, SemanticQuery, SemanticStore

NS = Namespace("acme", "llama", "v1", "t1")


def vec(*xs: float) -> np.ndarray:
    v = np.zeros(8, dtype=np.float32)
    v[: len(xs)] = xs
    return v / np.linalg.norm(v)


def point(key: str, v: np.ndarray, ns: Namespace = NS, ttl: float = 100, **kw) -> SemanticPoint:
    fields = {"context_hash": "c1", "params_hash": "p1", "prompt": key, "docs": ()} | kw
    return SemanticPoint(entry_key=key, vector=v, ns=ns, expires_at=time.time() + ttl, **fields)


def query(v: np.ndarray, ns: Namespace = NS, thr: float = 0.5, **kw) -> SemanticQuery:
    fields = {"context_hash": "c1", "params_hash": "p1"} | kw
    return SemanticQuery(vector=v, ns=ns, threshold=thr, now=time.time(), **fields)


def test_search__returns_best_first_above_threshold(semantic_store: SemanticStore):
    semantic_store.upsert([point("a", vec(1, 0)), point("b", vec(1, 1)), point("c", vec(0, 1))])
    hits = semantic_store.search(query(vec(1, 0.1), thr=0.6))
    assert [h.entry_key for h in hits] == ["a", "b"]
    assert hits[0].score > hits[1].score >= 0.6


@pytest.mark.parametrize(
    "other",
    [
        Namespace("other", "llama", "v1", "t1"),
        Namespace("acme", "mistral", "v1", "t1"),
        Namespace("acme", "llama", "v2", "t1"),
        Namespace("acme", "llama", "v1", "t2"),
    ],
)
def test_search__never_crosses_namespace(semantic_store: SemanticStore, other: Namespace):
    semantic_store.upsert([point("mine", vec(1, 0))])
    assert semantic_store.search(query(vec(1, 0), ns=other, thr=0.0)) == []
    assert [h.entry_key for h in semantic_store.search(query(vec(1, 0), thr=0.0))] == ["mine"]


@pytest.mark.parametrize("field", ["context_hash", "params_hash"])
def test_search__requires_same_context_and_params(semantic_store: SemanticStore, field: str):
    semantic_store.upsert([point("mine", vec(1, 0))])
    assert semantic_store.search(query(vec(1, 0), thr=0.0, **{field: "different"})) == []


def test_search__skips_expired_and_sweep_removes_them(semantic_store: SemanticStore):
    semantic_store.upsert([point("old", vec(1, 0), ttl=-1), point("new", vec(1, 0.2))])
    assert [h.entry_key for h in semantic_store.search(query(vec(1, 0), thr=0.0))] == ["new"]
    semantic_store.sweep_expired(time.time())
    assert semantic_store.count() == 1


def test_upsert__is_idempotent_by_entry_key(semantic_store: SemanticStore):
    for _ in range(3):
        semantic_store.upsert([point("same", vec(1, 0))])
    assert semantic_store.count() == 1


def test_delete_entries__removes_only_those(semantic_store: SemanticStore):
    semantic_store.upsert([point("a", vec(1, 0)), point("b", vec(0, 1))])
    semantic_store.delete_entries(["a"])
    assert semantic_store.count() == 1
    assert [h.entry_key for h in semantic_store.search(query(vec(0, 1), thr=0.0))] == ["b"]


def test_delete_where__by_doc_and_namespace(semantic_store: SemanticStore):
    other = Namespace("other", "llama", "v1", "t1")
    semantic_store.upsert(
        [
            point("a", vec(1, 0), docs=("d1", "d2")),
            point("b", vec(0, 1), docs=("d2",)),
            point("c", vec(1, 1), ns=other, docs=("d1",)),
        ]
    )
    semantic_store.delete_where({"tenant": "acme", "docs": "d1"})
    assert semantic_store.count({"tenant": "acme"}) == 1
    assert semantic_store.count({"tenant": "other"}) == 1  # the same doc id in another tenant stays
    semantic_store.delete_where({"tenant": "acme", "model_version": "v1"})
    assert semantic_store.count() == 1


def test_build_semantic__one_open_edge_store_per_folder(tmp_path):
    """Serving client and workers of one process share the shard of a folder (the process's
    Stack holds it); close is idempotent, and frees the folder for the next store."""
    from stoker.settings import StokerSettings
    from stoker.stack import Stack

    s = StokerSettings(qdrant_path=tmp_path / "shared", embedder_dim=8)
    stack = Stack(s)
    a = stack.semantic
    assert a is stack.semantic
    a.close()
    a.close()
    with Stack(s) as again:
        c = again.semantic
        assert c is not a and c.count() == 0
    assert c.closed
