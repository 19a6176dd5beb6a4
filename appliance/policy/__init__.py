"""What a token holder may reach: the one file-access policy (`files.py`, with
`request_files.py` for paths that arrive over the API), the hosts a source may connect to
(`hosts.py`) and secret masking in every output (`masking.py`). Depends on nothing else in
the appliance, so every room can use it.
"""
