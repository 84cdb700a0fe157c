"""`fptrace heads`: what each attention head does, measured."""
