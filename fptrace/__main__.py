from fptrace.client import main

main()
