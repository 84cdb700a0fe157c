"""`fptrace stats`: per-channel activation statistics over many prompts."""
