"""The in-container side: timing harness, worker pool, failure classes, shards and resume."""
