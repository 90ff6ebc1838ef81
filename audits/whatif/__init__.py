"""What-if analysis of a request log (`stoker analyze`): duplicates, simulated hit rates, advice.

Flow: keyed_log (rows -> exact-cache keys) -> neighbours (embed each unique prompt once, cosine
graph inside each must-filter group) -> cache_replay (a TTL cache replayed in time order) ->
report (per tenant and overall, recommended threshold and TTL, verdict).
"""
