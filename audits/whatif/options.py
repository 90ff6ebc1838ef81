"""The owner of `stoker analyze`'s setting (stoker/options.py): how many distinct prompts it
embeds at most before it estimates on a sample (sample.py says how)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WhatIfOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Embedding is nearly all of analyze's time: this many prompts take minutes on 2 cores.
    embed_budget: int = Field(default=30_000, ge=1)
