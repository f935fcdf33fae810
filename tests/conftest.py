"""Shared fixtures. Ring fixtures: a unique shared-memory segment name per test, cleaned up."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture
def ring_name():
    """A segment name no other test (or run) uses; the segment is unlinked after the test."""
    name = f"hsctest-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    yield name
    try:
        os.unlink(os.path.join("/dev/shm", name))
    except FileNotFoundError:
        pass
