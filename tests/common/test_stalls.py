"""The stall watch: transfers waiting on a server the cluster has left are cut, others never."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from emberfs.common.stalls import StallWatch


@pytest.fixture
def pairs():
    made: list[socket.socket] = []

    def pair() -> tuple[socket.socket, socket.socket]:
        a, b = socket.socketpair()
        made.extend((a, b))
        return a, b

    yield pair
    for s in made:
        s.close()


def _watch(serving: set[str], interval: float = 60.0, **kwargs) -> tuple[StallWatch, list[int]]:
    """A watch whose own thread stays asleep: the test calls ``check`` itself."""
    calls: list[int] = []

    def ask() -> set[str]:
        calls.append(1)
        return serving

    return StallWatch(ask, interval, **kwargs), calls


def test_young_transfers_are_not_checked(pairs):
    watch, calls = _watch(set())
    mine, _ = pairs()
    key = watch.add("10.0.0.1:9500", mine)
    assert watch.check(time.monotonic() + 59) == 0
    assert calls == []  # no routing question while nothing has waited
    assert watch.remove(key) is False
    watch.stop()


def test_a_transfer_to_a_server_that_left_is_cut_and_one_to_a_serving_server_is_not(pairs):
    left: list[str] = []
    watch, calls = _watch({"10.0.0.2:9500"}, on_abandon=left.append)
    gone_sock, gone_peer = pairs()
    alive_sock, alive_peer = pairs()
    gone = watch.add("10.0.0.1:9500", gone_sock)
    alive = watch.add("10.0.0.2:9500", alive_sock)
    later = time.monotonic() + 61
    assert watch.check(later) == 1
    assert calls == [1]
    assert left == ["10.0.0.1:9500"]
    assert gone_sock.recv(1) == b""  # shut down: a blocked receive wakes with EOF
    alive_peer.sendall(b"x")
    assert alive_sock.recv(1) == b"x"  # untouched
    assert watch.check(later) == 0  # cut once only
    assert watch.remove(gone) is True
    assert watch.remove(alive) is False
    assert watch.abandoned == 1
    watch.stop()


def test_a_finished_transfer_is_never_cut(pairs):
    watch, _ = _watch(set())
    mine, peer = pairs()
    key = watch.add("10.0.0.1:9500", mine)
    assert watch.remove(key) is False
    assert watch.check(time.monotonic() + 61) == 0
    peer.sendall(b"y")
    assert mine.recv(1) == b"y"  # the connection went back to a pool intact
    watch.stop()


def test_the_watch_thread_wakes_a_blocked_receive(pairs):
    watch, _ = _watch(set(), interval=0.05)
    mine, _ = pairs()
    mine.settimeout(30)
    got: list[bytes] = []
    with watch.watching("10.0.0.1:9500", mine) as watched:
        reader = threading.Thread(target=lambda: got.append(mine.recv(1)))
        reader.start()
        reader.join(10)
    assert not reader.is_alive() and got == [b""]
    assert watched.cut
    watch.stop()


def test_a_failing_routing_question_leaves_transfers_alone(pairs):
    def ask() -> set[str]:
        raise ConnectionError("metaserver down")

    watch = StallWatch(ask, 0.02)
    mine, peer = pairs()
    with watch.watching("10.0.0.1:9500", mine) as watched:
        time.sleep(0.1)  # the thread's checks fail and are logged
        with pytest.raises(ConnectionError):
            watch.check(time.monotonic() + 1)
        peer.sendall(b"z")
        assert mine.recv(1) == b"z"
    assert not watched.cut
    watch.stop()


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        StallWatch(set, 0)


def test_a_server_is_up_while_any_of_its_targets_heartbeats():
    from types import SimpleNamespace as T

    from emberfs.common.stalls import live_addresses
    from emberfs.proto import common_pb2 as pb

    targets = [
        T(data_address="a:1", state=pb.OFFLINE),
        T(data_address="a:1", state=pb.SYNCING),  # a returning node: forwards reach it
        T(data_address="b:1", state=pb.WAITING),
        T(data_address="c:1", state=pb.LASTSRV),  # its node stopped heartbeating
        T(data_address="d:1", state=pb.OFFLINE),
        T(data_address="e:1", state=pb.SERVING),
    ]
    assert live_addresses(targets) == {"a:1", "b:1", "e:1"}


def test_a_suspected_address_is_followed_until_the_cluster_declares_it_down():
    live = {"10.0.0.1:9500", "10.0.0.2:9500"}
    asked: list[int] = []
    flagged: list[str] = []

    def ask() -> set[str]:
        asked.append(1)
        return set(live)

    watch = StallWatch(ask, 60.0, horizon=120.0, on_suspect=flagged.append)
    now = time.monotonic()
    assert watch.check(now) == 0 and asked == []  # nothing to follow: no routing question
    watch.suspect("10.0.0.1:9500")
    watch.check(now + 1)
    watch.check(now + 2)
    assert len(asked) == 2  # the routing is asked at every check, with no transfer waiting
    assert flagged == ["10.0.0.1:9500", "10.0.0.1:9500"]  # still counted up: still flagged
    live.discard("10.0.0.1:9500")  # the metaserver declares it down
    watch.check(now + 3)
    assert flagged == ["10.0.0.1:9500"] * 2
    watch.check(now + 4)
    assert len(asked) == 3  # no longer followed
    watch.stop()


def test_a_suspicion_ends_after_its_horizon():
    asked: list[int] = []
    flagged: list[str] = []

    def ask() -> set[str]:
        asked.append(1)
        return {"10.0.0.1:9500"}

    watch = StallWatch(ask, 60.0, horizon=5.0, on_suspect=flagged.append)
    watch.suspect("10.0.0.1:9500")
    now = time.monotonic()
    watch.check(now + 1)
    watch.check(now + 6)
    assert len(asked) == 1 and flagged == ["10.0.0.1:9500"]
    watch.stop()
