"""The webhook sink: `sink.py` (queue, dispatcher, delivery tasks), `http.py` (its config
and one POST), `retry.py` (backoff) and `deadletter.py` (what could not be delivered)."""
