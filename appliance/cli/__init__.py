"""The `appliance` command: `main.py` (the parser and `serve`), `client.py` (subcommands
that talk to a running appliance), `regressions.py` and `tune.py` (their views), and the
commands that run without a server: `headless.py` (`run`), `oneshot.py` (one image),
`validate.py`. The top room: nothing imports it but `appliance/__main__.py`.
"""
