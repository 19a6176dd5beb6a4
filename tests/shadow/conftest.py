"""The regression watch's learned runtime (tests/watch/conftest.py), for the test of a
promotion the watch rolls back."""

from tests.watch.conftest import learned

__all__ = ["learned"]  # a fixture, offered to this folder's tests
