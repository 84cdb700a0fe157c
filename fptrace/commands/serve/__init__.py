"""`fptrace serve`: a resident server that keeps models loaded and answers every command."""
