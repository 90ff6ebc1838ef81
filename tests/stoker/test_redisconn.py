"""Redis clients from URLs: redis+cluster:// builds a cluster client, seeded by one node or many."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from schemas.errors import ConfigError
from stoker.embedded_cluster import EmbeddedCluster
from stoker.redisconn import connect, is_cluster_url
from stoker.settings import StokerSettings
from stoker.wiring import build_redis


def test_connect__a_plain_url_is_one_server(redis_url: str):
    r = connect(redis_url)
    assert isinstance(r, redis.Redis) and r.ping()
    r.close()


def test_connect__a_cluster_url_builds_a_cluster_client_that_finds_every_primary(
    redis_cluster: EmbeddedCluster,
):
    r = build_redis(StokerSettings(redis_url=redis_cluster.url))
    assert isinstance(r, RedisCluster)
    assert len(r.get_primaries()) == len(redis_cluster.primaries)
    r.set("stk:{t:acme}:probe", b"1")
    assert r.get("stk:{t:acme}:probe") == b"1"
    r.close()


def test_connect__several_seeds_are_each_tried(redis_cluster: EmbeddedCluster):
    r = connect(f"redis+cluster://127.0.0.1:1,{redis_cluster.url.split('//')[1]}")
    assert isinstance(r, RedisCluster) and r.ping()
    r.close()


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://127.0.0.1", "redis+cluster://h:1,h", "redis+cluster://127.0.0.1:7000/3"],
)
def test_connect__a_malformed_cluster_url_is_a_config_error(url: str):
    with pytest.raises(ConfigError):
        connect(url)


def test_is_cluster_url__only_the_cluster_schemes():
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:1/0") and not is_cluster_url("unix:///tmp/r.sock")
