"""The mount's memory of extended attribute values: valid while the inode's ctime is."""

from __future__ import annotations

from emberfs.client.mountxattrs import XattrCache


def test_a_value_is_used_while_the_ctime_is_not_newer():
    cache = XattrCache()
    assert cache.get(5, 100, "user.a") == (False, None)
    cache.put(5, 100, "user.a", b"1")
    cache.put(5, 100, "security.capability", None)  # not set: remembered too
    assert cache.get(5, 100, "user.a") == (True, b"1")
    assert cache.get(5, 100, "security.capability") == (True, None)
    assert cache.get(5, 90, "user.a") == (True, b"1")  # attributes older than the values
    assert cache.get(5, 101, "user.a") == (False, None)  # changed since: read again
    assert cache.get(6, 100, "user.a") == (False, None)
    # an answer read at a newer ctime replaces what was known
    cache.put(5, 101, "user.a", b"2")
    assert cache.get(5, 101, "user.a") == (True, b"2")
    assert cache.get(5, 101, "security.capability") == (False, None)


def test_a_change_of_this_mount_replaces_what_it_knew():
    cache = XattrCache()
    cache.put(5, 100, "user.a", b"1")
    cache.put(5, 100, "user.b", b"1")
    cache.changed(5, 120, "user.a", None)
    assert cache.get(5, 100, "user.a") == (True, None)  # a stale lookup still sees the change
    assert cache.get(5, 120, "user.b") == (False, None)  # the others are read again


def test_it_remembers_a_bounded_number_of_inodes():
    cache = XattrCache(limit=3)
    for inode in range(1, 5):
        cache.put(inode, 1, "user.a", b"x")
    cache.get(2, 1, "user.a")  # used: kept longer
    cache.put(5, 1, "user.a", b"x")
    known = [inode for inode in range(1, 6) if cache.get(inode, 1, "user.a")[0]]
    assert known == [2, 4, 5]
