from fptrace.cli.main import main

main()
