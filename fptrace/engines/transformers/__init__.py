"""The transformers engine, the default: the checkpoint loaded in transformers, hooked."""
