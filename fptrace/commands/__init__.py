"""One folder per command."""
