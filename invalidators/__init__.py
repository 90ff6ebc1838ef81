"""Staggered purge of retired versions and event-based invalidation."""
