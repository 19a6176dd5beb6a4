"""The MQTT sink: `sink.py` (the sink, its loop and status), `client.py` (the paho client),
`events.py` (what is published per result), `commands.py` (`<prefix>/cmd/...` requests),
`auth.py` (who may send them) and `config.py` (its config model)."""
