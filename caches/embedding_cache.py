"""The embedding cache: vectors in Redis by tenant, embedder and text hash, in front of an
embedder (caches/embedders.py), its lookups' write-backs on a thread of their own."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import redis

from caches import keys as K
from caches.boundary import as_bytes, redis_boundary
from caches.embedders import Embedder, Vectors, under_deadline
from caches.writebehind import WriteBehind


class CachedEmbedder:
    """Embeds through Redis: one MGET for the batch, the misses computed and written back
    (read_only: computed and not written, for callers that must write nothing, a dry run).
    Under `embed_deadline` (a lookup) the write-back is handed to a thread of its own
    (caches/writebehind.py), so the caller goes on to its search at once."""

    def __init__(
        self, inner: Embedder, r: redis.Redis, ttl_s: int, *, read_only: bool = False
    ) -> None:
        self.inner = inner
        self.id = inner.id
        self.dim = inner.dim
        self._r = r
        self._ttl_s = ttl_s
        self.read_only = read_only
        # A lookup's new vectors (asked under embed_deadline) are written on this thread
        self._behind = WriteBehind(r, ttl_s)

    def embed(self, tenant: str, texts: Sequence[str]) -> Vectors:
        keys = [K.embedding_key(tenant, self.id, t) for t in texts]
        with redis_boundary("embedding get"):
            raw = self._r.mget(keys) if keys else []
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: list[int] = []
        for i, b in enumerate(raw):
            if b is None or len(b) != 4 * self.dim:
                todo.append(i)
            else:
                out[i] = np.frombuffer(as_bytes(b), dtype=np.float32)
        if todo:
            fresh = self.inner.embed([texts[i] for i in todo])
            out[todo] = fresh
            if self.read_only:
                return out
            writes = [(keys[i], fresh[j].tobytes()) for j, i in enumerate(todo)]
            if under_deadline():  # a lookup: the write-back is not its to wait for
                self._behind.put(writes)
                return out
            pipe = self._r.pipeline(transaction=False)
            for key, value in writes:
                pipe.set(key, value, ex=self._ttl_s)
            with redis_boundary("embedding set"):
                pipe.execute()
        return out

    def embed_one(self, tenant: str, text: str) -> Vectors:
        out: Vectors = self.embed(tenant, [text])[0]
        return out

    def prime(self, tenant: str, texts: Sequence[str], vectors: Vectors) -> None:
        """Store vectors computed elsewhere (a bulk job embedding each distinct text once)."""
        pipe = self._r.pipeline(transaction=False)
        for text, v in zip(texts, vectors, strict=True):
            pipe.set(
                K.embedding_key(tenant, self.id, text),
                v.astype(np.float32).tobytes(),
                ex=self._ttl_s,
            )
        with redis_boundary("embedding prime"):
            pipe.execute()

    def close(self) -> None:
        """Land the queued write-backs and stop their thread (the model is not this one's)."""
        self._behind.close()
