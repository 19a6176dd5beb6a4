"""The `appliance` command: `main.py` (the parser and `serve`), `client.py` (subcommands
that talk to a running appliance), `regressions.py` (their view of the watch), `tune.py`
(`appliance tune`, local or `--url` through `tune_remote.py`), `signals.py` (Ctrl+C as a
stop flag), and the commands that run without a server: `headless.py` (`run`) and
`validate.py`. The top room: nothing imports it but `appliance/__main__.py`.
"""
