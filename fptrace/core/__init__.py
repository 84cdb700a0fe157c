"""The shared engine: hooks, the trace and its lens, statistics, sampling, the shared result types."""
