"""`fptrace schema`: the JSON Schema of every JSON output."""
