"""`python -m fptrace`: the same entry point as the `fptrace` command (fptrace/client.py)."""

from fptrace.client import main

main()
