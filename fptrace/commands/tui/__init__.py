"""`fptrace tui`: explore forward passes interactively, the model loaded once."""
