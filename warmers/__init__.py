"""Traffic profile, hot-set selection, the shadow warmer, the scheduler and the backends."""
