"""Simulation: the simulated model server and the sample-traffic generators. Tools of the demo,
the tests and the benchmarks (a week of traffic a 2-core machine cannot run on a real model);
production code never imports them."""
