"""Every collected test has a node id of its own.

pytest-xdist hands tests to its workers by node id, and `--dist loadfile` (the suite's
`make test`) ran only one of several items that shared one: schemathesis 4 builds an item
per API operation named `test_x[GET /health]`, but pytest 9 makes a test's id from its
original name and its parametrization (`Function.__init__`: `parent.id.child(base_name)
.with_params(callspec id)`), and these items have no parametrization, so all 47 got the
id `test_x`. `pytest -n 2 --dist loadfile` then reported "1 passed" for the 47 operations
a serial run checks, and the durations file merged them into one.

The ids of such items get the operation's label back, as schemathesis names them, and a
collection where two items still share an id stops with their names: it would silently
run fewer tests under xdist.
"""

from __future__ import annotations

from collections import Counter

import pytest


@pytest.hookimpl(tryfirst=True)  # before tests/support/quick.py reads the ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        label = getattr(item, "operation_label", None)  # schemathesis's SchemathesisFunction
        if label is not None and not item.nodeid.endswith("]") and item.parent is not None:
            original = getattr(item, "originalname", item.name)
            item._id = item.parent.id.child(original).with_params(label)
    shared = [nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1]
    if shared:
        raise pytest.UsageError(
            "tests that share a node id (pytest-xdist would run only one of each): "
            + ", ".join(shared[:10])
        )
