"""Semantic store on a Qdrant server through qdrant-client (`:memory:` serves small tests)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from qdrant_client import QdrantClient
from qdrant_client import models as qm

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


def _must(fields: dict[str, str]) -> list[qm.Condition]:
    return [qm.FieldCondition(key=k, match=qm.MatchValue(value=v)) for k, v in fields.items()]


class ServerSemanticStore(SemanticStore):
    def __init__(
        self, client: QdrantClient, collection: str, dim: int, *, serialize: bool = False
    ) -> None:
        """serialize: one call at a time, for qdrant-client's local mode (":memory:"), which is
        not safe across threads: a count read while a point was being upserted once raised
        IndexError (its payloads grown, its vectors not yet). A server needs no lock."""
        self.dim = dim
        self._c = client
        self._col = collection
        self._closed = False
        self._lock = threading.Lock() if serialize else None
        with self._calling("create collection"):
            if not self._c.collection_exists(collection):
                self._c.create_collection(
                    collection,
                    vectors_config={
                        "": qm.VectorParams(size=dim, distance=qm.Distance.COSINE),
                        ANSWER_VECTOR: qm.VectorParams(size=dim, distance=qm.Distance.COSINE),
                    },
                )
                self._create_indexes()

    @contextmanager
    def _calling(self, op: str) -> Iterator[None]:
        with qdrant_boundary(op):
            if self._lock is None:
                yield
            else:
                with self._lock:
                    yield

    def _create_indexes(self) -> None:
        # Local mode (":memory:") warns that indexes do nothing there; the server path needs them.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self._create_indexes_now()

    def _create_indexes_now(self) -> None:
        tenant = qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)
        self._c.create_payload_index(self._col, "tenant", field_schema=tenant)
        for f in (*FILTER_FIELDS[1:], "docs", "entry_key", "kind"):
            self._c.create_payload_index(self._col, f, field_schema=qm.PayloadSchemaType.KEYWORD)
        self._c.create_payload_index(
            self._col, "expires_at", field_schema=qm.PayloadSchemaType.FLOAT
        )

    def upsert(self, points: Sequence[SemanticPoint]) -> None:
        if not points:
            return
        pts = [
            qm.PointStruct(id=point_id(p.entry_key), vector=p.named_vectors(), payload=p.payload())
            for p in points
        ]
        with self._calling("upsert"):
            self._c.upsert(self._col, points=pts, wait=True)

    def search(self, q: SemanticQuery) -> list[SemanticMatch]:
        kind, not_kinds = q.kinds()
        fields = q.must() | ({"kind": kind} if kind else {})
        flt = qm.Filter(
            must=[*_must(fields), qm.FieldCondition(key="expires_at", range=qm.Range(gt=q.now))],
            must_not=[c for k in not_kinds for c in _must({"kind": k})] or None,
        )
        with self._calling("search"):
            res = self._c.query_points(
                self._col,
                query=q.vector.tolist(),
                query_filter=flt,
                limit=q.limit,
                with_payload=True,
                with_vectors=[ANSWER_VECTOR] if q.with_answers else False,
                score_threshold=q.threshold,
            )
        return [SemanticMatch.of(h.payload, h.score, h.vector) for h in res.points]

    def delete_entries(self, entry_keys: Sequence[str]) -> None:
        if entry_keys:
            with self._calling("delete"):
                self._c.delete(
                    self._col,
                    points_selector=qm.PointIdsList(points=[point_id(k) for k in entry_keys]),
                )

    def delete_where(self, must: dict[str, str]) -> None:
        with self._calling("delete by filter"):
            self._c.delete(
                self._col, points_selector=qm.FilterSelector(filter=qm.Filter(must=_must(must)))
            )

    def sweep_expired(self, now: float) -> None:
        flt = qm.Filter(must=[qm.FieldCondition(key="expires_at", range=qm.Range(lte=now))])
        with self._calling("sweep"):
            self._c.delete(self._col, points_selector=qm.FilterSelector(filter=flt))

    def count(self, must: dict[str, str] | None = None) -> int:
        flt = qm.Filter(must=_must(must)) if must else None
        with self._calling("count"):
            return int(self._c.count(self._col, count_filter=flt, exact=True).count)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the client; a second close does nothing (the store may be shared)."""
        if not self._closed:
            self._closed = True
            self._c.close()
