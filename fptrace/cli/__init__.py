"""The command line: the Typer app and what every command shares."""
