"""Placeholder: the s3 backend fixture (`s3_backend`) lands with the s3 backend."""

from __future__ import annotations

import pytest


@pytest.fixture
def s3_backend():
    pytest.skip("s3 backend not implemented yet")


@pytest.fixture
def s3_http_backend():
    pytest.skip("s3 over HTTP not implemented yet")
