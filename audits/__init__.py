"""Audits: what the cache served or would serve, judged. The wrong-hit monitor re-asks the
backend for a sample of served hits (judge: one verdict; monitor: the worker, paced below live
traffic; metrics: its series), and the what-if analysis replays a request log offline (whatif/).
Nothing here warms."""
