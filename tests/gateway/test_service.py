"""The gateway as a server: what it does to the process while it serves."""

from __future__ import annotations

import gc
import sys

from gateway.service import SWITCH_INTERVAL_S
from simulation.backend.http import SimulatorThread
from tests.gateway.conftest import GatewayFactory, client


def test_service__objects_alive_at_start_are_frozen_while_serving_and_thawed_after(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    before = gc.get_freeze_count()
    gw = make_gateway(sim.url)
    # Everything alive when serving began (the model, torch, the app) is out of reach of a full
    # collection, which walked ~520k objects in 740 ms with the model loaded
    frozen = gc.get_freeze_count()
    assert frozen > 10_000
    gc.collect()  # a full collection while serving leaves them frozen
    # (a frozen object whose last reference goes is still freed, so the count may only
    # shrink by those few; thawed, it would be 0)
    assert frozen - 1_000 < gc.get_freeze_count() <= frozen
    r = client(gw).chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hello"}], temperature=0
    )
    assert r.choices[0].message.content
    gw.stop()
    gw.join(30)
    assert gc.get_freeze_count() == before  # serving over: the collector reaches them again


def test_service__a_server_that_stops_first_leaves_the_other_frozen_and_fast(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    """Two gateways in one process (the tests host several): the collector and the GIL belong
    to the process, so the first to stop must not thaw or reset what the other serves with."""
    before = gc.get_freeze_count(), sys.getswitchinterval()
    first, second = make_gateway(sim.url), make_gateway(sim.url)
    frozen = gc.get_freeze_count()
    assert frozen > 10_000 and sys.getswitchinterval() == SWITCH_INTERVAL_S
    first.stop()
    first.join(30)
    # still frozen (a few frozen objects are freed by their refcounts meanwhile), still 1 ms
    assert gc.get_freeze_count() > frozen // 2 and sys.getswitchinterval() == SWITCH_INTERVAL_S
    second.stop()
    second.join(30)
    assert (gc.get_freeze_count(), sys.getswitchinterval()) == before


def test_service__the_gil_switches_every_millisecond_while_serving_and_as_before_after(
    make_gateway: GatewayFactory, sim: SimulatorThread
) -> None:
    before = sys.getswitchinterval()
    assert before != SWITCH_INTERVAL_S  # CPython's default, 5 ms
    gw = make_gateway(sim.url)
    assert sys.getswitchinterval() == SWITCH_INTERVAL_S
    gw.stop()
    gw.join(30)
    assert sys.getswitchinterval() == before
