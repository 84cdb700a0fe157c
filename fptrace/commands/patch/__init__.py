"""`fptrace patch`: causal tracing of where a prediction is carried."""
