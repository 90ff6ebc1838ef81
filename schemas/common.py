"""Value types shared by events and cache entries."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def utcnow() -> datetime:
    return datetime.now(UTC)


class DocRef(BaseModel):
    """A retrieved document and the version the answer was computed from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    doc_id: str = Field(min_length=1, max_length=512)
    version: int = Field(ge=0)


class RequestParams(BaseModel):
    """Generation parameters. Unknown parameters are kept (they change the answer, so they key it)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    temperature: float = Field(default=0.0, ge=0.0)
    max_tokens: int | None = Field(default=None, ge=1)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    no_cache: bool = False

    def as_dict(self) -> dict[str, Any]:
        """All parameters that shape the answer (no_cache is a directive, not a parameter).

        Built by hand, not by model_dump: it runs on every cache lookup (0.3 us vs 2 us)."""
        d: dict[str, Any] = {"temperature": self.temperature}
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.top_p is not None:
            d["top_p"] = self.top_p
        if self.__pydantic_extra__:
            d.update(self.__pydantic_extra__)
        return d
