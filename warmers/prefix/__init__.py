"""KV prefix warming: worker (counts shared prompt prefixes from the request log) -> hot (the
hot prefixes in Redis) -> warm (fills the engines' prefix caches). Triggered before_peak (ahead
of the busy hours) and after_restart (a replica came back cold)."""
