"""`fptrace graph`: attribution graphs of the model's own neurons, exact under their freezing."""
