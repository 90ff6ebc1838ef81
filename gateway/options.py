"""The gateway's options: a plain frozen object the shell builds from StokerSettings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Lookups give up after this and the request goes upstream: the seeds' practitioners bypass
# their cache at 50 ms, about a tenth of a short generation.
DEFAULT_LOOKUP_BUDGET_S = 0.05


@dataclass(frozen=True)
class GatewayOptions:
    upstream_url: str
    # Sent upstream as the bearer token; None passes the client's Authorization through
    # (unless an API-key map is set: the client's key is then the gateway's, never forwarded).
    upstream_api_key: str | None = None
    upstream_timeout_s: float = 300.0  # a long generation streams for minutes
    upstream_connections: int = 256
    lookup_budget_s: float = DEFAULT_LOOKUP_BUDGET_S
    lookup_threads: int = 16  # the cache client is synchronous: lookups and stores run here
    # Identical misses in flight wait this long for the first one's answer, then go upstream.
    herd_wait_s: float = 30.0
    max_body_bytes: int = 4 * 1024 * 1024
    # sha256(api key) -> tenant; empty: the tenant comes from X-Stoker-Tenant.
    api_key_tenants: Mapping[str, str] = field(default_factory=dict)
    default_tenant: str | None = None
    tenant_from_body: bool = False  # the `stoker.tenant` body field: forgeable, off by default
    default_model_version: str = "default"
    live_version_ttl_s: float = 1.0
    # The temperature of a request that gives none. OpenAI's API samples at 1 by default, so a
    # request without one is not cached; set 0 where the upstream decodes greedily by default.
    default_temperature: float = 1.0
    # Live answers up to this size go into the request log whole (the workers learn from
    # them); a longer one is logged by digest.
    log_answer_max_bytes: int = 16_384
    log_buffer: int = 10_000
    drain_s: float = 30.0  # SIGTERM: in-flight requests get this long to finish
    # SIGTERM: keep accepting (with /readyz at 503) this long first, so a load balancer sees
    # the gateway leave before its listener closes (Kubernetes: a few seconds).
    drain_notice_s: float = 0.0
