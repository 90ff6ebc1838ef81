"""The one bounded wait every test uses: poll a condition until it holds or the time is up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest


def wait_for(
    pred: Callable[[], object],
    timeout_s: float = 5.0,
    what: str = "the condition",
    interval_s: float = 0.01,
) -> None:
    """Return as soon as pred() is true; fail the test after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


async def wait_for_async(
    pred: Callable[[], object],
    timeout_s: float = 5.0,
    what: str = "the condition",
    interval_s: float = 0.005,
) -> None:
    """wait_for inside an event loop: yields to the loop between polls."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
