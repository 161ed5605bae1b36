"""Bugs stay loud in tests: the suite fails on an unexpected exception production contains.

Production contains an exception no check anticipated while handling one peer's data
(``peers/contain.py``: refused, sender struck, the node goes on) and counts it process-wide in
``INCIDENTS``. ``no_contained_bug`` (autouse, from ``tests/conftest.py``; a pytest plugin with
``-p pulse_node.testing.contain_guard``) fails every test during which one was contained,
naming it, unless the test asks for ``contained``: those that inject one on purpose and check
what it left. In-process swarms run their nodes in the test's process, so their incidents count
too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pulse_node.peers.contain import INCIDENTS, Incidents


@pytest.fixture(autouse=True)
def no_contained_bug(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if an unexpected exception was contained while it ran (see the module docstring)."""
    before = INCIDENTS.total
    yield
    new = INCIDENTS.total - before
    if new and "contained" not in request.fixturenames:
        pytest.fail(f"{new} unexpected exception(s) contained (a bug production would hide): "
                    f"{list(INCIDENTS.recent)[-new:]}", pytrace=False)


@pytest.fixture
def contained() -> Incidents:
    """For a test that injects unexpected exceptions: the process's ``Incidents`` (it checks them)."""
    return INCIDENTS
