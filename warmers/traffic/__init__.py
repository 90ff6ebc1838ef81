"""The traffic stage, in its order: worker (consumes inference.requests) -> event_time (drops
events outside the clock bounds) -> decode (bytes to one Observation: the per-event reference)
| count_batch (bytes to per-tenant deltas, a batch at a time: the hot path) -> delta (a
tenant's counts and the script that applies them) -> profile (the hour-of-week counts in Redis
that the hot set and the prefix warm read)."""
