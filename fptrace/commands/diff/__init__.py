"""`fptrace diff`: do two runs compute the same, layer by layer."""
