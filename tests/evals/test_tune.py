"""The rules that choose the matcher's constants on CLINC150 val (evals/tune.py): narrow unit
tests of the picks, on made-up curves (the run itself is benchmarks/tune_semantic.py)."""

from __future__ import annotations

from caches.matching.verified import Level, check_ladder
from evals.tune import Tried, lowest_clean, pick_ladder


def test_pick_ladder__most_hits_per_target_and_never_a_looser_level_after_a_stricter():
    tried = [
        Tried(Level(0.60, 1, 0.10), 1000, 30),  # 3%: over every target
        Tried(Level(0.62, 1, 0.10), 900, 9),  # 1%
        Tried(Level(0.62, 2, 0.10), 800, 4),  # 0.5%
        Tried(Level(0.60, 2, 0.20), 850, 3),  # 0.35%, but looser in score than 0.62: skipped
        Tried(Level(0.66, 2, 0.20), 700, 1),
        Tried(Level(0.88, 3, 0.30), 300, 0),
    ]
    got = pick_ladder(tried, targets=(0.01, 0.005, 0.002, 0.0))
    assert got == (
        Level(0.62, 1, 0.10),
        Level(0.62, 2, 0.10),
        Level(0.66, 2, 0.20),
        Level(0.88, 3, 0.30),
    )
    check_ladder(got)  # the product's own check: levels never loosen


def test_pick_ladder__skips_a_target_nothing_meets_and_picks_a_level_once():
    tried = [Tried(Level(0.70, 1, 0.10), 500, 10), Tried(Level(0.88, 3, 0.30), 200, 0)]
    assert pick_ladder(tried, targets=(0.001, 0.0005, 0.0)) == (Level(0.88, 3, 0.30),)


def test_lowest_clean__plain_stops_at_the_first_score_over_and_bounded_asks_for_evidence():
    curve = [(0.84, 800, 7), (0.86, 700, 6), (0.88, 600, 0), (0.90, 480, 0), (0.94, 200, 0)]
    assert lowest_clean(curve, 0.01) == 0.84  # 7/800 is under 1%
    assert lowest_clean(curve, 0.0) == 0.88
    # 0 of 200 cannot show 1% at 95% (it takes 299); 0 of 600 can; 7 of 800 cannot
    assert lowest_clean(curve, 0.01, bounded=True) == 0.88
    assert lowest_clean([(0.94, 200, 0)], 0.01, bounded=True) is None
