"""The client's chunk capabilities: kept per file, renewed before expiry and after a refusal."""

from __future__ import annotations

import pytest

from emberfs.client.capabilities import Capabilities
from emberfs.common.auth import CAPABILITY, ClusterKeys, generate_secret

KEYS = ClusterKeys([generate_secret().encode()])


class Metaserver:
    """Signs what it is asked for, as ``Authorize`` does, and counts the calls."""

    def __init__(self, ttl: float = 60.0, refuse: bool = False) -> None:
        self.ttl, self.refuse, self.calls = ttl, refuse, []

    def __call__(self, inode: int, session_id: int) -> bytes:
        self.calls.append((inode, session_id))
        if self.refuse:
            raise PermissionError(13, "unknown or revoked token")
        return KEYS.sign_capability(inode, read=True, write=bool(session_id), ttl=self.ttl)


def inode_of(credential) -> int:
    section = credential.section(b"", b"", b"")
    assert section[0] == CAPABILITY
    return KEYS.open_capability(section[1:]).inode


def test_a_capability_from_an_open_is_used_without_asking_again():
    meta = Metaserver()
    caps = Capabilities(meta)
    caps.learn(KEYS.sign_capability(7, read=True, write=False, ttl=60))
    assert inode_of(caps.credential(7, write=False)) == 7
    assert caps.credential(7, write=True) is None  # no write session to ask with
    assert meta.calls == []


def test_a_write_capability_renews_through_its_session_and_also_reads():
    meta = Metaserver()
    caps = Capabilities(meta)
    caps.learn(KEYS.sign_capability(9, read=True, write=True, ttl=60), session_id=5)
    assert inode_of(caps.credential(9, write=False)) == 9  # the write capability reads too
    caps.forget(9, write=True)
    assert inode_of(caps.credential(9, write=True)) == 9
    assert meta.calls == [(9, 5)]


def test_one_near_its_expiry_or_missing_is_renewed():
    meta = Metaserver()
    caps = Capabilities(meta)
    caps.learn(KEYS.sign_capability(3, read=True, write=False, ttl=-1))  # expired
    assert inode_of(caps.credential(3, write=False)) == 3
    assert inode_of(caps.credential(4, write=False)) == 4  # never opened here: asked for
    assert meta.calls == [(3, 0), (4, 0)]


def test_a_refused_renewal_is_the_callers_permission_error():
    caps = Capabilities(Metaserver(refuse=True))
    with pytest.raises(PermissionError):
        caps.credential(11, write=False)


def test_an_insecure_cluster_gets_no_credentials_and_no_calls():
    meta = Metaserver()
    caps = Capabilities(meta)
    caps.learn(b"")  # what an insecure metaserver sends with an open
    assert caps.credential(12, write=False) is None
    assert meta.calls == []


def test_expired_capabilities_are_dropped_as_more_files_are_opened():
    caps = Capabilities(Metaserver())
    for inode in range(1, 5000):
        caps.learn(KEYS.sign_capability(inode, read=True, write=False, ttl=-1))
    caps.learn(KEYS.sign_capability(99999, read=True, write=False, ttl=60))
    assert len(caps) < 1000  # the expired ones went when the count passed PRUNE_AT
