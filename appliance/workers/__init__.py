"""`appliance serve --workers N`: the streams in N processes behind one API (serve.py)."""
