"""The semantic store contract: vectors with a namespace payload, filtered top-k, expiry."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from caches.keys import Namespace

# Point ids are uuid5 of the entry key under this namespace: rewriting an entry overwrites its
# point instead of adding a twin (uuid4 ids would duplicate on every redelivery).
POINT_NAMESPACE = uuid.UUID("6b7f3c1e-5d0a-4c1b-9a57-2f6a0f3e8d11")

# Payload fields that every search filters on (must) and that get keyword indexes.
FILTER_FIELDS = (
    "tenant",
    "model_id",
    "model_version",
    "template_version",
    "context_hash",
    "params_hash",
)


# The point's second named vector; the prompt's is the default (unnamed) one.
ANSWER_VECTOR = "answer"
Kind = Literal["entry", "probe", "unstored"]


def point_id(entry_key: str) -> str:
    return str(uuid.uuid5(POINT_NAMESPACE, entry_key))


def namespace_fields(ns: Namespace, context_hash: str, params_hash: str) -> dict[str, str]:
    """The FILTER_FIELDS of one answer: written into every point, required by every search."""
    return {
        "tenant": ns.tenant,
        "model_id": ns.model_id,
        "model_version": ns.model_version,
        "template_version": ns.template_version,
        "context_hash": context_hash,
        "params_hash": params_hash,
    }


@dataclass(frozen=True)
class SemanticPoint:
    """One cached prompt's vector. The answer itself lives in Redis under `entry_key`."""

    entry_key: str
    vector: npt.NDArray[np.float32]
    ns: Namespace
    context_hash: str
    params_hash: str
    expires_at: float
    prompt: str
    docs: tuple[str, ...] = ()
    # What the backend answered, embedded: the evidence a verified matcher weighs. An "entry"
    # point indexes a cached answer (in Redis under entry_key); a "probe" point only records
    # what the backend answered to a prompt (a monitor re-ask), with no entry behind it; an
    # "unstored" point marks a prompt whose answer was not stored, and `why` says why.
    answer_vector: npt.NDArray[np.float32] | None = None
    kind: Kind = "entry"
    why: str = ""

    def named_vectors(self) -> dict[str, Any]:
        """The point's vectors as both Qdrant clients take them (the prompt's is unnamed)."""
        vecs: dict[str, Any] = {"": self.vector.tolist()}
        if self.answer_vector is not None:
            vecs[ANSWER_VECTOR] = self.answer_vector.tolist()
        return vecs

    def payload(self) -> dict[str, Any]:
        return {
            **namespace_fields(self.ns, self.context_hash, self.params_hash),
            "entry_key": self.entry_key,
            "expires_at": self.expires_at,
            "prompt": self.prompt,
            "docs": list(self.docs),
            "kind": self.kind,
            **({"why": self.why} if self.why else {}),
        }


@dataclass(frozen=True)
class SemanticQuery:
    vector: npt.NDArray[np.float32]
    ns: Namespace
    context_hash: str
    params_hash: str
    threshold: float
    now: float
    limit: int = 3
    # False: entries only, without answer vectors (what a static matcher reads). True: entries
    # and probes, each with its answer vector when it has one (what a verified matcher reads).
    with_answers: bool = False
    # True: the "unstored" marks only (what a miss's reason looks for), never otherwise.
    unstored: bool = False

    def must(self) -> dict[str, str]:
        return namespace_fields(self.ns, self.context_hash, self.params_hash)

    def kinds(self) -> tuple[str | None, tuple[str, ...]]:
        """(the kind every match must be, or None; the kinds no match may be)."""
        if self.unstored:
            return "unstored", ()
        return None, ("unstored",) if self.with_answers else ("probe", "unstored")


@dataclass(frozen=True)
class SemanticMatch:
    entry_key: str
    score: float
    prompt: str
    payload: dict[str, Any]
    answer_vector: npt.NDArray[np.float32] | None = None

    @property
    def kind(self) -> Kind:
        kind = self.payload.get("kind")
        return kind if kind in ("probe", "unstored") else "entry"  # older points: entries

    @classmethod
    def of(cls, payload: dict[str, Any] | None, score: float, vectors: Any = None) -> SemanticMatch:
        """From a search hit's payload and named vectors (both Qdrant clients return the same)."""
        p = dict(payload or {})
        answer = vectors.get(ANSWER_VECTOR) if isinstance(vectors, dict) else None
        vec = None if answer is None else np.asarray(answer, dtype=np.float32)
        return cls(str(p["entry_key"]), float(score), str(p["prompt"]), p, vec)


class SemanticStore(ABC):
    """Invariant: search returns only points whose payload matches every must field of the query
    and whose expires_at lies after query.now, best score first, none under the threshold."""

    dim: int

    @abstractmethod
    def upsert(self, points: Sequence[SemanticPoint]) -> None: ...

    @abstractmethod
    def search(self, q: SemanticQuery) -> list[SemanticMatch]: ...

    @abstractmethod
    def delete_entries(self, entry_keys: Sequence[str]) -> None: ...

    @abstractmethod
    def delete_where(self, must: dict[str, str]) -> None:
        """Delete every point whose payload matches all of `must` (a namespace, a doc, ...)."""

    @abstractmethod
    def sweep_expired(self, now: float) -> None: ...

    @abstractmethod
    def count(self, must: dict[str, str] | None = None) -> int: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        pass
