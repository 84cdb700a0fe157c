"""`fptrace run`: one prompt traced through the model, block by block."""
