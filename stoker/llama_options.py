"""The owner of the llama_* settings' defaults and bounds (stoker/options.py).

Their defaults are ServeOptions' (modelserver.py), which stays a dataclass of the standard
library: `make setup` runs modelserver.py to build llama-server before pydantic is installed.
This model adds the bounds a setting is checked against at start."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from stoker.modelserver import DEFAULT_SERVE


class LlamaOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    threads: int = Field(default=DEFAULT_SERVE.threads, ge=1, le=256)
    parallel: int = Field(default=DEFAULT_SERVE.parallel, ge=1, le=64)  # slots
    ctx: int = Field(default=DEFAULT_SERVE.ctx, ge=512, le=1_048_576)  # tokens, all slots
