"""When a tenant's answers last changed: the invalidation worker's note the monitor reads."""

from __future__ import annotations

import pytest
import redis

from caches import changes
from caches import keys as K

pytestmark = pytest.mark.topologies


def test_changes__keep_the_latest_time_per_tenant_with_a_ttl(redis_client: redis.Redis):
    assert changes.read(redis_client, ["acme", "globex"]) == {}
    changes.note(redis_client, {"acme": 1_000.5, "globex": 2_000.0})
    changes.note(redis_client, {"acme": 900.0})  # a replayed older event: no step back
    assert changes.read(redis_client, ["acme", "globex", "initech"]) == {
        "acme": 1_000.5,
        "globex": 2_000.0,
    }
    changes.note(redis_client, {"acme": 1_500.25}, ttl_s=60)
    assert changes.read(redis_client, ["acme"]) == {"acme": 1_500.25}
    ttl = redis_client.ttl(K.changed_key("acme"))
    assert 0 < ttl <= 60  # type: ignore[operator]
    assert K.changed_key("acme").startswith(K.tenant_tag("acme") + ":")  # the tenant's slot
