"""`fptrace tokens`: what a model's tokenizer makes of a text, or what token ids are, without
its weights."""
