"""The cluster's keys: server credentials of frames and calls, capabilities, rotation."""

from __future__ import annotations

import pytest

from emberfs.common import framing
from emberfs.common.auth import (
    AuthError,
    CapabilityCredential,
    ClusterKeys,
    generate_secret,
    load_secret_file,
    write_secret_file,
)

OLD, NEW = generate_secret().encode(), generate_secret().encode()


def frame_parts(credential, meta=b"meta", table=b"\x01\x02\x03\x04"):
    body = framing.header_body(framing.Op.WRITE, 0, len(meta), 10, 65536, credential.length)
    return body, credential.section(body, meta, table), meta, table


def test_a_server_frame_is_bound_to_its_header_meta_and_crc_table():
    keys = ClusterKeys([OLD])
    body, section, meta, table = frame_parts(keys.server_credential())
    assert keys.check_frame(body, section, meta, table).server
    for changed in (
        (body[:-1] + b"\x01", section, meta, table),
        (body, section, b"metA", table),
        (body, section, meta, b"\x01\x02\x03\x05"),
        (body, section[:-1] + bytes([section[-1] ^ 1]), meta, table),
        (body, b"", meta, table),
        (body, b"\x09" + section[1:], meta, table),
    ):
        with pytest.raises(AuthError):
            keys.check_frame(*changed)
    with pytest.raises(AuthError):  # another cluster's secret
        ClusterKeys([NEW]).check_frame(body, section, meta, table)


def test_capabilities_carry_inode_access_and_expiry():
    keys = ClusterKeys([OLD])
    grant = keys.check_frame(
        *frame_parts(CapabilityCredential(keys.sign_capability(5, read=True, write=False, ttl=60)))
    )
    assert not grant.server and grant.covers(5, write=False)
    assert not grant.covers(5, write=True) and not grant.covers(6, write=False)
    with pytest.raises(AuthError, match="expired"):
        keys.open_capability(keys.sign_capability(5, read=True, write=False, ttl=-1))
    with pytest.raises(AuthError, match="forged"):
        keys.open_capability(ClusterKeys([NEW]).sign_capability(5, read=True, write=True, ttl=60))


def test_a_server_call_is_bound_to_its_method_and_request_and_accepted_once():
    keys = ClusterKeys([OLD])
    key, value = keys.call_signer().metadata("/emberfs.StorageService/ListChunks", b"req")
    assert key == "emberfs-server-auth"
    with pytest.raises(AuthError):
        keys.check_call("/emberfs.StorageService/RemoveChunks", b"req", value)
    with pytest.raises(AuthError):
        keys.check_call("/emberfs.StorageService/ListChunks", b"other", value)
    keys.check_call("/emberfs.StorageService/ListChunks", b"req", value)
    with pytest.raises(AuthError, match="replayed"):
        keys.check_call("/emberfs.StorageService/ListChunks", b"req", value)
    for bad in (None, "", "garbage", "1.2.zz"):
        with pytest.raises(AuthError):
            keys.check_call("/m", b"", bad)


def test_rotation_accepts_the_old_and_the_new_secret_and_signs_with_the_first():
    old_only, both, new_only = ClusterKeys([OLD]), ClusterKeys([NEW, OLD]), ClusterKeys([NEW])
    body, section, meta, table = frame_parts(old_only.server_credential())
    assert both.check_frame(body, section, meta, table).server  # old senders still get in
    body, section, meta, table = frame_parts(both.server_credential())
    assert new_only.check_frame(body, section, meta, table).server  # it signs with the new one
    with pytest.raises(AuthError):
        old_only.check_frame(body, section, meta, table)


def test_key_files(tmp_path):
    path = tmp_path / "cluster.key"
    secret = write_secret_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_secret_file(path) == [secret.encode()]
    path.write_text(f"# rotated\n{NEW.decode()}\n\n{OLD.decode()}\n")
    assert load_secret_file(path) == [NEW, OLD]
    for text in ("", "# only a comment\n", "short\n"):
        path.write_text(text)
        with pytest.raises(ValueError):
            load_secret_file(path)
