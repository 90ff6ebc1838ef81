"""What a cache entry holds: the answer plus its provenance. Stored as orjson bytes in Redis.

Entries are plain frozen dataclasses, not pydantic models: they sit on the hit path, where
decoding must cost a few microseconds (orjson + a constructor), and only stoker writes them.
`from_bytes` still checks the shape and says clearly what is wrong with foreign bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

ENTRY_SCHEMA_VERSION: Literal[1] = 1
SOURCES = ("live", "warm")

Source = Literal["live", "warm"]


class EntryDecodeError(ValueError):
    """Bytes under an entry key that are not an entry of a schema version this build knows."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where an answer came from. Times are epoch seconds (UTC): cheap to decode on every hit."""

    model_id: str
    model_version: str
    template_version: str
    generated_at: float
    cached_at: float
    source: Source

    def generated_at_dt(self) -> datetime:
        return datetime.fromtimestamp(self.generated_at, UTC)

    def cached_at_dt(self) -> datetime:
        return datetime.fromtimestamp(self.cached_at, UTC)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached answer. Invariant: provenance names the namespace its key was built from."""

    tenant: str
    prompt: str
    response: str
    provenance: Provenance
    context_hash: str
    docs: tuple[tuple[str, int], ...] = ()  # (doc_id, version) the answer was computed from
    tokens_in: int = 0
    tokens_out: int = 0
    gpu_ms: float = 0.0
    schema_version: int = ENTRY_SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)  # orjson serialises dataclasses and datetimes natively

    @classmethod
    def from_bytes(cls, data: bytes) -> CacheEntry:
        try:
            obj: dict[str, Any] = orjson.loads(data)
            if obj["schema_version"] != ENTRY_SCHEMA_VERSION:
                raise EntryDecodeError(
                    f"entry schema_version {obj['schema_version']!r}; this build knows {ENTRY_SCHEMA_VERSION}"
                )
            p = obj["provenance"]
            if p["source"] not in SOURCES:
                raise EntryDecodeError(f"entry source {p['source']!r} is not one of {SOURCES}")
            prov = Provenance(
                p["model_id"],
                p["model_version"],
                p["template_version"],
                float(p["generated_at"]),
                float(p["cached_at"]),
                p["source"],
            )
            return cls(
                obj["tenant"],
                obj["prompt"],
                obj["response"],
                prov,
                obj["context_hash"],
                tuple((d, int(v)) for d, v in obj["docs"]),
                obj["tokens_in"],
                obj["tokens_out"],
                obj["gpu_ms"],
            )
        except EntryDecodeError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise EntryDecodeError(f"not a cache entry: {type(e).__name__}: {e}") from e
