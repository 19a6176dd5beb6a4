"""Fuzz tests (issue 14, item 3): hypothesis properties of every parser of untrusted input."""
