"""Test tooling that ships with Fjord: the chaos harness (:mod:`fjord.testing.chaos` is its pure
core, :mod:`fjord.testing.chaos_cluster` drives a real local cluster with it)."""
