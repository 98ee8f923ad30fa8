"""The benchmark harness (`make bench`): Saga Admin measured against this machine's own limits."""
