"""The llama.cpp engine (`--engine llama.cpp`, `diff --engine-b llama.cpp`): the pinned binding
(binding.py), one captured pass (capture.py), the Trace built from it (trace.py), its numerics
reproduced in transformers (emulate.py, emulation.py) and a Q4_K_M writer (quantize.py)."""
