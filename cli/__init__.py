"""The ``quicksilver`` command line: ``cli.main`` registers every command (serve, token,
export, bench, data, train, eval, router, spans); nothing else imports this package."""
