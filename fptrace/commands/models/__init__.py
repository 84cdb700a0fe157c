"""`fptrace models`: the built-in models."""
