"""Deploy pre-warm: fill a new model version's namespace with the hot set the old one served.

The traffic profile keys queries by model id and template, not version (on purpose), so what
was learned under `previous_version` is exactly the hot set the new version will be asked in
the coming window. The plan is made with model_version=`version`: every warm item's cache
identity names the new namespace, the freshness check looks there, and nothing lands under the
old one. The old version's entries are the cutover job's business (grace, then purge).

READY means the pre-warm met its bar: of the items planned, at least `min_share` are in the new
namespace afterwards (landed now, or already cached). A run where most sends failed (the backend
is down or refuses) is not ok, and the cutover does not publish READY on it.

Synchronous (the warm runs its own event loop): call it from a worker thread, not from inside
a running event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmers.budget import Budget
from warmers.runner import WarmRunner
from warmers.window import Window

# Half of the planned hot set in place: enough that the first hours after cutover are not cold,
# loose enough that a few backend errors or stale refusals do not fail a deploy.
DEFAULT_MIN_SHARE = 0.5


@dataclass(frozen=True)
class HotSetPrewarm:
    """What one pre-warm did (invalidators.deployjob.PrewarmReport reads part of it)."""

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
    already_cached: int = 0  # of the skipped, in the new namespace already
    min_share: float = DEFAULT_MIN_SHARE

    @property
    def warmed(self) -> int:
        return self.cached

    @property
    def share(self) -> float:
        """Share of the planned items in the new namespace after the run (1.0 if none)."""
        return 1.0 if self.planned == 0 else (self.cached + self.already_cached) / self.planned

    @property
    def ok(self) -> bool:
        """The bar: nothing was planned (nothing learned to warm with: the cache fills from
        live traffic), or at least min_share of the plan is in place."""
        return self.share >= self.min_share

    @property
    def detail(self) -> str:
        head = (
            f"pre-warmed {self.version} for {self.window}"
            if self.ok
            else (
                f"pre-warm of {self.version} below its bar ({self.share:.0%} of the plan in place, "
                f"need {self.min_share:.0%})"
            )
        )
        return (
            f"{head}: planned {self.planned}, sent {self.sent}, cached {self.cached}, skipped "
            f"{self.skipped}, failed {self.failed}, {self.gpu_seconds:.1f} GPU-s"
        )


class HotSetPrewarmer:
    """The deploy cutover's pre-warm step (invalidators.deployjob.Prewarmer) on a WarmRunner:
    the same selection and shadow warmer as `stoker warm`."""

    def __init__(
        self,
        runner: WarmRunner,
        budget: Budget,
        window: Callable[[], Window] = Window.next_hour,
        min_share: float = DEFAULT_MIN_SHARE,
    ) -> None:
        self.runner, self.budget, self.window = runner, budget, window
        self.min_share = min_share

    def prewarm(
        self,
        model_id: str,
        version: str,
        previous_version: str | None,
        tenants: Sequence[str] | None,
    ) -> HotSetPrewarm:
        """Plan and warm; tenants None or empty = every tenant in the profile. Safe to run
        twice: what the first run cached is skipped by the second."""
        tenants = tuple(tenants or ())
        win = self.window()
        plan = self.runner.plan(
            win, self.budget, tenants=tenants or None, model_id=model_id, model_version=version
        )
        s = self.runner.warm(plan, labels={"model_id": model_id, "version": version})
        return HotSetPrewarm(
            model_id, version, previous_version, tuple(tenants), str(win), len(plan.items),
            s.sent, s.cached, s.skipped_cached + s.skipped_uncacheable + s.skipped_negative,
            s.failed, s.refused_stale, s.gpu_seconds, s.skipped_cached, self.min_share,
        )  # fmt: skip

    __call__ = prewarm
