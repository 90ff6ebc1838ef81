"""Semantic-hit acceptance: which cached answer may serve a query beyond a cosine threshold."""

from caches.matching.base import Accepted, Candidate, Matcher, MatchStats, Query, StaticThreshold
from caches.matching.guards import Guarded, first_violation
from caches.matching.verified import LADDER, Level, VerifiedMatcher

__all__ = [
    "LADDER",
    "Accepted",
    "Candidate",
    "Guarded",
    "Level",
    "MatchStats",
    "Matcher",
    "Query",
    "StaticThreshold",
    "VerifiedMatcher",
    "first_violation",
]
