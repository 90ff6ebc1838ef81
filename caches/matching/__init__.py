"""Semantic-hit acceptance: which cached answer may serve a query beyond a cosine threshold."""

from caches.matching.base import Accepted, Candidate, Matcher, MatchStats, Query, StaticThreshold
from caches.matching.guards import Guarded, first_violation
from caches.matching.learned import AnswerAgreement, AnswerBank, EntryRadius

__all__ = [
    "Accepted",
    "AnswerAgreement",
    "AnswerBank",
    "Candidate",
    "EntryRadius",
    "Guarded",
    "MatchStats",
    "Matcher",
    "Query",
    "StaticThreshold",
    "first_violation",
]
