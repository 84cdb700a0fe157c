"""`fptrace explain`: one block recomputed step by step and proven equal to the model."""
