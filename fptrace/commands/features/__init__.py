"""`fptrace features`: the stream in sparse dictionary features, with the error term."""
