"""`fptrace batch`: many prompts to resumable JSON Lines, locally or on Ray."""
