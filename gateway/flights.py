"""Herd protection: concurrent identical requests make one lookup and one upstream call
(Facebook's leases, in one process).

The first request of a key leads: it looks the cache up and, on a miss, calls upstream; when
it has the whole answer (a hit's or the upstream's) it hands it to every request that joined
meanwhile. The others wait at most `wait_s`; a leader that fails, is cut short or gets an
answer that must not be cached hands over None, and each of them then goes its own way (fail
open). A flight ends when its leader does, so the next request of the key leads again (by
then the answer is usually cached). Keyed before the lookup, so even a burst that times out
the cache lookups (and would bypass it) reaches the upstream once.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")


class Flight(Generic[T]):
    def __init__(self, key: str) -> None:
        self.key = key
        self._fut: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self.joined = 0
        # Someone else ends the flight, not its handler: a streamed answer's relay, or the
        # store of the answer (so requests arriving before the entry lands still share it).
        self.keep = False

    def land(self, value: T | None) -> None:
        if not self._fut.done():
            self._fut.set_result(value)

    async def wait(self, timeout_s: float) -> T | None:
        """The leader's answer, or None (it had none to share, or it took too long)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._fut), timeout_s)
        except TimeoutError:
            return None


class Flights(Generic[T]):
    """One event loop's flights, by cache key."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight[T]] = {}

    def follow(self, key: str) -> Flight[T] | None:
        """The flight in progress for key, joined; None when there is none (lead one)."""
        flight = self._flights.get(key)
        if flight is not None:
            flight.joined += 1
        return flight

    def start(self, key: str) -> Flight[T]:
        """Lead the flight of key. The leader must call end() whatever happens (or hand that
        on: Flight.keep)."""
        flight: Flight[T] = Flight(key)
        self._flights[key] = flight
        return flight

    def end(self, key: str, flight: Flight[T]) -> None:
        """The flight is over: followers still waiting get None unless it landed an answer."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        flight.land(None)

    def __len__(self) -> int:
        return len(self._flights)
