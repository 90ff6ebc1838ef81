"""Deploy pre-warm: fill a new model version's namespace with the hot set the old one served.

The traffic profile keys queries by model id and template, not version (on purpose), so what
was learned under `previous_version` is exactly the hot set the new version will be asked in
the coming window. The plan is made with model_version=`version`: every warm item's cache
identity names the new namespace, the freshness check looks there, and nothing lands under the
old one. The old version's entries are the cutover job's business (grace, then purge).

Synchronous (the warm runs its own event loop): call it from a worker thread, not from inside
a running event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stoker.settings import StokerSettings
from warmers.budget import Budget
from warmers.runner import WarmRunner
from warmers.window import Window


@dataclass(frozen=True)
class PrewarmResult:
    model_id: str
    version: str
    previous_version: str | None
    tenants: tuple[str, ...]  # asked for; () = every tenant in the profile
    window: str
    planned: int
    sent: int
    cached: int
    skipped: int  # already cached with TTL left, uncacheable, or recently failed
    failed: int
    refused_stale: int  # the version was retired (or a context invalidated) while warming
    gpu_seconds: float

    @property
    def warmed(self) -> int:
        return self.cached

    @property
    def detail(self) -> str:
        return (
            f"pre-warmed {self.version} for {self.window}: planned {self.planned}, sent "
            f"{self.sent}, cached {self.cached}, skipped {self.skipped}, failed {self.failed}, "
            f"{self.gpu_seconds:.1f} GPU-s"
        )

    @property
    def ok(self) -> bool:
        """Nothing was planned, or something landed: a pre-warm never blocks a deploy by itself
        (the cache still fills from live traffic); a run where every send failed is not ok."""
        return self.planned == 0 or self.cached > 0 or self.sent == 0


class HotSetPrewarmer:
    """The deploy cutover's pre-warm step (invalidators.deployjob.Prewarmer) on a WarmRunner:
    the same selection and shadow warmer as `stoker warm`."""

    def __init__(
        self,
        runner: WarmRunner,
        budget: Budget,
        window: Callable[[], Window] = Window.next_hour,
    ) -> None:
        self.runner, self.budget, self.window = runner, budget, window

    def prewarm(
        self,
        model_id: str,
        version: str,
        previous_version: str | None,
        tenants: Sequence[str] | None,
    ) -> PrewarmResult:
        """Plan and warm; tenants None or empty = every tenant in the profile. Safe to run
        twice: what the first run cached is skipped by the second."""
        tenants = tuple(tenants or ())
        win = self.window()
        plan = self.runner.plan(
            win, self.budget, tenants=tenants or None, model_id=model_id, model_version=version
        )
        s = self.runner.warm(plan)
        return PrewarmResult(
            model_id, version, previous_version, tuple(tenants), str(win), len(plan.items),
            s.sent, s.cached, s.skipped_cached + s.skipped_uncacheable + s.skipped_negative,
            s.failed, s.refused_stale, s.gpu_seconds,
        )  # fmt: skip

    __call__ = prewarm


def build_prewarmer(settings: StokerSettings) -> HotSetPrewarmer:
    """From settings: the warm runner (progress off: it runs inside a worker) and the budget."""
    from warmers.runner import build_runner, default_budget

    return HotSetPrewarmer(build_runner(settings, progress=False), default_budget(settings))


def prewarm(
    model_id: str,
    version: str,
    previous_version: str | None,
    tenants: Sequence[str] | None,
    *,
    settings: StokerSettings | None = None,
) -> PrewarmResult:
    """One-shot pre-warm from settings (builds the runner; a long-lived caller keeps a
    HotSetPrewarmer instead, so the embedder loads once)."""
    return build_prewarmer(settings or StokerSettings()).prewarm(
        model_id, version, previous_version, tenants
    )
