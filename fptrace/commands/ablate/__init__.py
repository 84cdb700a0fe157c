"""`fptrace ablate`: remove attention heads or MLPs and measure what changes."""
