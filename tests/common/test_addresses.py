from __future__ import annotations

import pytest

from emberfs.common.addresses import join_address, split_address


@pytest.mark.parametrize(
    "text,parsed",
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("[::1]:0", ("::1", 0)),
        ("host:65535", ("host", 65535)),
    ],
)
def test_split_and_join_round_trip(text, parsed):
    assert split_address(text) == parsed
    assert join_address(*parsed) == text


@pytest.mark.parametrize("text", ["", "9400", ":9400", "host:", "host:port", "host:65536", "h:-1"])
def test_bad_addresses(text):
    with pytest.raises(ValueError):
        split_address(text)
