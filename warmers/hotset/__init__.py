"""The hot set: what to warm for a window. options -> regimes (days that look alike) ->
forecast (each query's expected requests) -> paraphrase (clusters that one entry serves) ->
value (what a warm saves) -> select (HotSetSelector: budgeted, fair across tenants by
warm_budget) -> plan (the items a warm run sends). calibration credits warmed entries' hits;
renew rewrites logged requests whose documents changed."""
