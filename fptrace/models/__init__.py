"""Model resolution, loading, tokenizers and the per-family table."""
