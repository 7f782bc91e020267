"""fsspec's own abstract test suites, run against EmberFS."""

from __future__ import annotations

import posixpath
import uuid

import fsspec.tests.abstract as abstract
import pytest

from emberfs.client.fs import EmberFileSystem


class EmberFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, cluster):
        instance = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
        yield instance
        instance.close()

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs):
        path = f"/abstract-{uuid.uuid4().hex[:12]}"
        fs.makedirs(path)
        yield path
        if fs.exists(path):
            fs.rm(path, recursive=True)

    @pytest.fixture
    def supports_empty_directories(self):
        return True


class TestEmberCopy(abstract.AbstractCopyTests, EmberFixtures):
    pass


class TestEmberGet(abstract.AbstractGetTests, EmberFixtures):
    pass


class TestEmberPut(abstract.AbstractPutTests, EmberFixtures):
    pass


class TestEmberOpen(abstract.AbstractOpenTests, EmberFixtures):
    pass


class TestEmberPipe(abstract.AbstractPipeTests, EmberFixtures):
    pass
