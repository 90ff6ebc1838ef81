"""Kafka plumbing: topics, producers, worker loops, commit-after-apply, dead-letter topic."""
