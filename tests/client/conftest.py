"""Fixtures of the client tests: a filesystem on the shared cluster and a scratch directory."""

from __future__ import annotations

import uuid

import fsspec
import pytest

from emberfs.client.fs import EmberFileSystem


def register_protocols() -> None:
    """Make ``emberfs://`` and ``ember://`` known to fsspec (entry points may be missing)."""
    for name in ("emberfs", "ember"):
        fsspec.register_implementation(name, EmberFileSystem, clobber=True)


@pytest.fixture
def fs(cluster):
    """A filesystem instance of its own, talking to the shared cluster."""
    register_protocols()
    instance = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def base(fs):
    """A fresh directory for one test, removed afterwards."""
    path = f"/t-{uuid.uuid4().hex[:12]}"
    fs.makedirs(path)
    yield path
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass
