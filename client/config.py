"""Where a client finds its metaserver and its token: options, environment, config file.

In order: the option given to the file system (or the command), then the
environment (``EMBERFS_META``, ``EMBERFS_TOKEN``), then the client config
file, then the default address. The config file is TOML, at
``$EMBERFS_CONFIG`` or ``$XDG_CONFIG_HOME/emberfs/client.toml`` (default
``~/.config/emberfs/client.toml``)::

    meta = "127.0.0.1:9400"
    token = "emb1...."
    admin = "http://127.0.0.1:9401"
    admin_token = "..."
    tls_ca = "/path/to/ca.pem"      # optional: the metaserver speaks TLS
    cache_dir = "/var/cache/emberfs" # optional: a local disk cache of file chunks
    cache_size = "100G"              # what it holds at most (default 10G)

``emberfs up`` writes one for the cluster it starts (readable by its owner only).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

CONFIG_ENV = "EMBERFS_CONFIG"
META_ENV = "EMBERFS_META"
TOKEN_ENV = "EMBERFS_TOKEN"
CACHE_DIR_ENV = "EMBERFS_CACHE_DIR"
CACHE_SIZE_ENV = "EMBERFS_CACHE_SIZE"
DEFAULT_META = "127.0.0.1:9400"

_KEYS = ("meta", "token", "admin", "admin_token", "tls_ca", "cache_dir", "cache_size")


def config_path() -> Path:
    """The client config file's path (it need not exist)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "emberfs" / "client.toml"


def load() -> dict[str, str]:
    """The settings of the config file ({} when there is none).

    Raises
    ------
    ValueError
        When the file is not valid TOML.
    """
    path = config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return {k: str(v) for k, v in data.items() if k in _KEYS and v}


def setting(name: str, env: str | None = None, default: str | None = None) -> str | None:
    """A setting from the environment variable ``env``, else the config file, else ``default``."""
    if env and os.environ.get(env):
        return os.environ[env]
    return load().get(name, default)


def default_meta() -> str:
    return setting("meta", META_ENV, DEFAULT_META) or DEFAULT_META


def default_token() -> str | None:
    return setting("token", TOKEN_ENV)


def cache_settings(cache_dir: str | None, cache_size) -> tuple[str, str | int | None]:
    """The disk cache's directory (``""``: none) and size, options first, then environment and file."""
    if cache_dir is None:
        cache_dir = setting("cache_dir", CACHE_DIR_ENV) or ""
    if cache_size is None:
        cache_size = setting("cache_size", CACHE_SIZE_ENV)
    return cache_dir, cache_size


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write(path: str | os.PathLike, **settings: str | None) -> Path:
    """Write a config file with ``settings`` (those of :data:`_KEYS`), mode 0600."""
    unknown = set(settings) - set(_KEYS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{k} = {_quote(v)}\n" for k, v in settings.items() if v)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path
