"""Startable: what runs beside the caller (a child process, a server thread) and is used as
`with X(...) as x:`. One base for the embedded stack, the Redis cluster, the gateway server and
the simulated backend, so that each writes its start and its stop once and the context
protocol never differs between them."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Startable:
    """`start()` returns self once running; `close()` (by default `stop()`) ends it and is what
    leaving the `with` block calls, on success or failure alike."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
