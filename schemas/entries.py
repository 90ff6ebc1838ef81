"""What a cache entry holds: the answer plus its provenance. Stored as orjson bytes in Redis."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from schemas.common import DocRef

ENTRY_SCHEMA_VERSION: Literal[1] = 1

Source = Literal["live", "warm"]


class Provenance(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str
    model_version: str
    template_version: str
    generated_at: datetime
    cached_at: datetime
    source: Source


class CacheEntry(BaseModel):
    """One cached answer. Invariant: provenance names the namespace its key was built from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = ENTRY_SCHEMA_VERSION
    tenant: str
    prompt: str
    response: str
    provenance: Provenance
    context_hash: str
    docs: tuple[DocRef, ...] = ()
    tokens_in: int = Field(default=0, ge=0)
    tokens_out: int = Field(default=0, ge=0)
    gpu_ms: float = Field(default=0.0, ge=0.0)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def from_bytes(cls, data: bytes) -> CacheEntry:
        return cls.model_validate(orjson.loads(data))
