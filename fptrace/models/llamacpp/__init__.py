"""llama.cpp as a second engine: the pinned binding (binding.py) and one captured pass
(engine.py)."""
