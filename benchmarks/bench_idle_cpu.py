"""CPU an idle embedded stack burns: `stoker gateway` with nothing configured, left alone.

The gateway starts as a user starts it (no STOKER_* setting but its own STOKER_STATE_DIR, a
free port): Tansu, redis-server, llama-server and every stream worker. Once /readyz answers
and `--settle-s` have passed (the workers joining their groups), the CPU seconds of the
gateway and all its descendants are read from /proc before and after `--seconds` of no
traffic at all. cpu_share = those seconds / the wall seconds: 1.0 is one core kept busy.
Goal: <= 0.05, where a laptop's fan stays off. The line also splits the share by process
(the gateway's own Python, tansu, redis-server, llama-server).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from _common import emit

from stoker.embedded import free_port

STOKER = [sys.executable, "-m", "stoker.cli"]
GOAL_CPU_SHARE = 0.05
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# SIGTERM drains (STOKER_GATEWAY_DRAIN_S, 5 s by default) and Tansu takes 5 s more to exit.
_STOP_S = 60.0


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu_s(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (name, user + system CPU seconds) of `root` and every descendant alive now."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            parents[int(entry)] = int(fields[1])
    wanted, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in wanted} - wanted
        wanted |= more
        grew = bool(more)
    out = {}
    for pid in wanted:
        fields = _stat(pid)
        if fields is not None:  # else it ended meanwhile
            name = "gateway" if pid == root else _comm(pid)
            out[pid] = (name, (int(fields[11]) + int(fields[12])) * _TICK_S)  # utime, stime
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> float:
    """Seconds until GET url answers 200; raises if the gateway exits or time is up."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"stoker gateway exited {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"stoker gateway not ready at {url} within {timeout_s:.0f} s")


def measure(root: int, seconds: float) -> tuple[float, dict[str, float], float]:
    """(total CPU s, CPU s by process name, wall s) of the tree over `seconds` of idleness."""
    before, t0 = tree_cpu_s(root), time.monotonic()
    time.sleep(seconds)
    after, wall = tree_cpu_s(root), time.monotonic() - t0
    by_name: dict[str, float] = {}
    for pid, (name, cpu) in after.items():  # a process started meanwhile counts from zero
        by_name[name] = by_name.get(name, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
    return sum(by_name.values()), by_name, wall


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as a user's Ctrl-C, then SIGKILL if it has not exited within _STOP_S."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle seconds measured")
    ap.add_argument("--settle-s", type=float, default=10.0, help="idle seconds before measuring")
    # a first run on a fresh machine builds llama-server first (minutes; docs/model-server.md)
    ap.add_argument("--ready-timeout-s", type=float, default=900.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
        env["STOKER_STATE_DIR"] = str(Path(tmp) / "state")  # never a user's running stack
        port = free_port()
        with open(Path(tmp) / "gateway.log", "w+b") as log:
            proc = subprocess.Popen(
                [*STOKER, "gateway", "--port", str(port)], env=env, stdout=log, stderr=log
            )
            try:
                ready_s = wait_ready(proc, f"http://127.0.0.1:{port}/readyz", args.ready_timeout_s)
                time.sleep(args.settle_s)
                cpu_s, by_name, wall = measure(proc.pid, args.seconds)
            except BaseException:
                stop(proc)
                log.seek(0)
                sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
                raise
            code = stop(proc)
    share = cpu_s / wall
    emit(
        "idle_cpu",
        cpu_share=round(share, 4),
        by_process={name: round(s / wall, 4) for name, s in sorted(by_name.items())},
        seconds=round(wall, 1),
        settle_s=args.settle_s,
        ready_s=round(ready_s, 1),
        ratio=round(share / GOAL_CPU_SHARE, 3),
        goal_cpu_share_max=GOAL_CPU_SHARE,
        gateway_exit=code,
    )


if __name__ == "__main__":
    main()
