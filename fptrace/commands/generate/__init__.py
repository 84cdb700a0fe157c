"""`fptrace generate`: generation as a sequence of forward passes, with the KV cache."""
