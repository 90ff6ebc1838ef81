"""A small HTTP/1.1 load generator: N keep-alive connections on uvloop, bounded in count and time.

Each connection sends one request, reads the whole answer (Content-Length or chunked), records
the latency and sends the next: a closed loop, so `concurrency` is the number of requests in
flight. A Python client on the same 2 cores costs ~30-50 us a request here, far less than
either gateway under test, and every peer gets the same client, so ratios are fair.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import uvloop

Request = Callable[[int], tuple[bytes, bytes]]  # request number -> (path, JSON body)
Check = Callable[[int, dict[bytes, bytes], bytes], None]  # status, headers, body


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: int = 0  # connection errors and non-2xx answers
    elapsed_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_s)

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s else 0.0


def run(
    url: str,
    request: Request,
    *,
    concurrency: int,
    seconds: float,
    max_requests: int = 10_000_000,
    headers: dict[str, str] | None = None,
    check: Check | None = None,
    think_s: Callable[[], float] | None = None,
) -> LoadResult:
    """Hammer `url` for `seconds` (or `max_requests`, whichever comes first); `think_s`: each
    connection waits this long (drawn anew) after an answer before its next request, as a user
    or an agent does (None: at once, a saturating load)."""
    return uvloop.run(
        _run(url, request, concurrency, seconds, max_requests, headers or {}, check, think_s)
    )


async def _run(
    url: str,
    request: Request,
    concurrency: int,
    seconds: float,
    max_requests: int,
    headers: dict[str, str],
    check: Check | None,
    think_s: Callable[[], float] | None = None,
) -> LoadResult:
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    out = LoadResult()
    counter = iter(range(max_requests))
    deadline = time.perf_counter() + seconds

    async def conn() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for n in counter:
                if time.perf_counter() > deadline:
                    return
                path, body = request(n)
                head = (
                    b"POST " + path + b" HTTP/1.1\r\nhost: " + host.encode()
                    + b"\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(body)).encode() + b"\r\n" + extra + b"\r\n"
                )  # fmt: skip
                t0 = time.perf_counter()
                writer.write(head + body)
                status, hdrs, payload = await _read(reader)
                out.latencies_s.append(time.perf_counter() - t0)
                out.statuses[status] += 1
                out.errors += not 200 <= status < 300
                if check is not None:
                    check(status, hdrs, payload)
                if think_s is not None:
                    await asyncio.sleep(think_s())
        except (ConnectionError, asyncio.IncompleteReadError):
            out.errors += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(conn() for _ in range(concurrency)))
    out.elapsed_s = time.perf_counter() - t0
    return out


async def _read(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        if b":" in ln:
            k, _, v = ln.partition(b":")
            hdrs[k.strip().lower()] = v.strip()
    if hdrs.get(b"transfer-encoding", b"").lower() == b"chunked":
        return status, hdrs, await _chunked(reader)
    return status, hdrs, await reader.readexactly(int(hdrs.get(b"content-length", b"0")))


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
