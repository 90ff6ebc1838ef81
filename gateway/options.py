"""The gateway's options: a frozen model the shell builds from StokerSettings, and the owner of
the gateway_* settings' defaults and bounds (stoker/options.py points them here)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from schemas.common import Tenant


class GatewayOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream_url: str
    # Sent upstream as the bearer token; None passes the client's Authorization through
    # (unless an API-key map is set: the client's key is then the gateway's, never forwarded).
    upstream_api_key: str | None = None
    upstream_timeout_s: float = Field(default=300.0, gt=0)  # a long generation streams for minutes
    upstream_connections: int = Field(default=256, ge=1)
    # How often the gateway asks the upstream's /models (its state and its models; each ask
    # bounded by 5 s). A request that finds it unreachable makes it ask at once.
    upstream_check_s: float = Field(default=10.0, gt=0, le=3_600)
    # Refuse (404 model_not_found) a model the upstream does not list. Off: forwarded with a
    # warning, since clients send aliases the upstream maps.
    strict_models: bool = False
    # Lookups give up after this and the request goes upstream: the seeds' practitioners bypass
    # their cache at 50 ms, about a tenth of a short generation. In ms, the setting's unit.
    lookup_budget_ms: float = Field(default=50.0, gt=0)
    # A miss's response holds its last byte until its answer is searchable (written and
    # indexed; or its not-stored mark), at most this long: a paraphrase asked the moment the
    # client has the answer then finds it. Indexing embeds the answer (~10-30 ms for 1,000
    # characters on a CPU), behind the lookups' embeds; past this, the response goes on.
    index_wait_ms: float = Field(default=500.0, ge=0)
    # the cache client is synchronous: lookups and stores run here
    lookup_threads: int = Field(default=16, ge=1, le=256)
    # Identical misses in flight wait this long for the first one's answer, then go upstream.
    herd_wait_s: float = Field(default=30.0, ge=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # sha256(api key) -> tenant; empty: the tenant comes from X-Stoker-Tenant.
    api_key_tenants: Mapping[str, str] = Field(default_factory=dict)
    default_tenant: Tenant | None = None
    tenant_from_body: bool = False  # the `stoker.tenant` body field: forgeable, off by default
    default_model_version: str = Field(default="default", min_length=1)
    live_version_ttl_s: float = 1.0
    # The temperature of a request that gives none. OpenAI's API samples at 1 by default, so a
    # request without one is not cached; set 0 where the upstream decodes greedily by default.
    default_temperature: float = Field(default=1.0, ge=0)
    # Live answers up to this size go into the request log whole (the workers learn from
    # them); a longer one is logged by digest.
    log_answer_max_bytes: int = Field(default=16_384, ge=0)
    log_buffer: int = Field(default=10_000, ge=1)
    drain_s: float = Field(
        default=30.0, gt=0
    )  # SIGTERM: in-flight requests get this long to finish
    # SIGTERM: keep accepting (with /readyz at 503) this long first, so a load balancer sees
    # the gateway leave before its listener closes (Kubernetes: a few seconds).
    drain_notice_s: float = Field(default=0.0, ge=0, le=60)

    @property
    def lookup_budget_s(self) -> float:
        """The lookup budget in the seconds asyncio's timeouts take."""
        return self.lookup_budget_ms / 1000.0

    @property
    def index_wait_s(self) -> float:
        return self.index_wait_ms / 1000.0
