"""`fptrace shapes`: the shape flow, parameters, memory and FLOPs of any config, without weights."""
