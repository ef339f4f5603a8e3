"""The failure report: the job's first failure agreed across nodes, the root cause and the
ranks that only died with it."""
