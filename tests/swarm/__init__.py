"""The fault swarm: the production ``Node`` in the simulator, under seeded schedules of faults,
with the protocol's invariants checked as it runs (``python -m tests.swarm --help``)."""
