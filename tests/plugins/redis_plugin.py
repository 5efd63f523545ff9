"""Placeholder: the redis backend fixture (`redis_backend`) lands with the redis backend."""

from __future__ import annotations

import pytest


@pytest.fixture
def redis_backend():
    pytest.skip("redis backend not implemented yet")


@pytest.fixture
def redis_cluster_backend():
    pytest.skip("redis cluster backend not implemented yet")
