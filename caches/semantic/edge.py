"""Semantic store on Qdrant Edge: the real Qdrant engine in-process (HNSW, keyword indexes)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import qdrant_edge as qe

from caches.boundary import qdrant_boundary
from caches.semantic.base import (
    ANSWER_VECTOR,
    FILTER_FIELDS,
    SemanticMatch,
    SemanticPoint,
    SemanticQuery,
    SemanticStore,
    point_id,
)


def _must(fields: dict[str, str]) -> list[qe.ConditionType]:
    return [qe.FieldCondition(key=k, match=qe.MatchValue(v)) for k, v in fields.items()]


class EdgeSemanticStore(SemanticStore):
    """One Edge shard per folder. Writes are serialised; searches run concurrently."""

    def __init__(self, path: Path, dim: int) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self._closed = False
        path.mkdir(parents=True, exist_ok=True)
        with qdrant_boundary("open edge shard"):
            if any(path.iterdir()):
                self._shard = qe.EdgeShard.load(str(path))
            else:
                params = qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)
                cfg = qe.EdgeConfig(vectors={"": params, ANSWER_VECTOR: params})
                self._shard = qe.EdgeShard.create(str(path), cfg)
                self._create_indexes()

    def _create_indexes(self) -> None:
        # tenant is the tenant field (co-locates a tenant's points); the rest are plain keywords.
        self._shard.update(
            qe.UpdateOperation.create_field_index("tenant", qe.KeywordIndexParams(is_tenant=True))
        )
        for f in (*FILTER_FIELDS[1:], "docs", "entry_key", "kind"):
            self._shard.update(
                qe.UpdateOperation.create_field_index(f, qe.PayloadSchemaType.Keyword)
            )
        self._shard.update(
            qe.UpdateOperation.create_field_index("expires_at", qe.PayloadSchemaType.Float)
        )

    def upsert(self, points: Sequence[SemanticPoint]) -> None:
        if not points:
            return
        pts = [qe.Point(point_id(p.entry_key), p.named_vectors(), p.payload()) for p in points]
        with qdrant_boundary("upsert"), self._lock:
            self._shard.update(qe.UpdateOperation.upsert_points(pts))

    def search(self, q: SemanticQuery) -> list[SemanticMatch]:
        kind, not_kinds = q.kinds()
        flt = qe.Filter(
            must=[
                *_must(q.must() | ({"kind": kind} if kind else {})),
                qe.FieldCondition(key="expires_at", range=qe.RangeFloat(gt=q.now)),
            ],
            must_not=[c for k in not_kinds for c in _must({"kind": k})] or None,
        )
        req = qe.SearchRequest(
            query=qe.Query.Nearest(q.vector.tolist()),
            limit=q.limit,
            filter=flt,
            with_payload=True,
            with_vector=[ANSWER_VECTOR] if q.with_answers else False,
            score_threshold=q.threshold,
        )
        with qdrant_boundary("search"):
            hits = self._shard.search(req)
        return [SemanticMatch.of(h.payload, h.score, h.vector) for h in hits]

    def delete_entries(self, entry_keys: Sequence[str]) -> None:
        if entry_keys:
            with qdrant_boundary("delete"), self._lock:
                self._shard.update(
                    qe.UpdateOperation.delete_points([point_id(k) for k in entry_keys])
                )

    def delete_where(self, must: dict[str, str]) -> None:
        with qdrant_boundary("delete by filter"), self._lock:
            self._shard.update(
                qe.UpdateOperation.delete_points_by_filter(qe.Filter(must=_must(must)))
            )

    def sweep_expired(self, now: float) -> None:
        expired: list[qe.ConditionType] = [
            qe.FieldCondition(key="expires_at", range=qe.RangeFloat(lte=now))
        ]
        flt = qe.Filter(must=expired)
        with qdrant_boundary("sweep"), self._lock:
            self._shard.update(qe.UpdateOperation.delete_points_by_filter(flt))

    def count(self, must: dict[str, str] | None = None) -> int:
        flt = qe.Filter(must=_must(must)) if must else None
        with qdrant_boundary("count"):
            return int(self._shard.count(qe.CountRequest(exact=True, filter=flt)))

    def optimize(self) -> None:
        """Build HNSW for bulk-loaded points (bench, demo); writes keep working meanwhile."""
        with qdrant_boundary("optimize"), self._lock:
            self._shard.optimize()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush and release the shard; a second close does nothing (the store may be shared)."""
        with qdrant_boundary("close"), self._lock:
            if self._closed:
                return
            self._closed = True
            self._shard.flush()
            self._shard.close()
