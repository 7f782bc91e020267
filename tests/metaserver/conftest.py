"""Fixtures of the metaserver tests: the metadata engines every namespace test runs on."""

from __future__ import annotations

import itertools
import os

import pytest

from emberfs.metaserver.store.kv import MemoryEngine

_prefixes = itertools.count(1)


@pytest.fixture(params=["memory", "etcd"])
def store(request):
    """A factory of empty metadata engines of one kind: the same tests run on each.

    ``store()`` is a new engine with nothing in it (on etcd: a key prefix of its
    own on the session's etcd server, with etcd's default limits).
    """
    made = []

    def make():
        if request.param == "memory":
            engine = MemoryEngine()
        else:
            from emberfs.metaserver.store.etcd import EtcdEngine

            etcd = request.getfixturevalue("etcd")
            engine = EtcdEngine(etcd.url(f"ns-{os.getpid()}-{next(_prefixes)}"))
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
