"""Sample request logs: two weeks of a support bot's traffic (sample), a long tail (longtail),
and the shapes the hot-set benchmark compares (shapes)."""
