"""PyTorch distributed checkpoints on EmberFS that are never seen half-written.

``torch.distributed.checkpoint`` (DCP) writes a checkpoint as a directory: one
file per rank (or per item) and a ``.metadata`` file, written last by the
coordinator. Its fsspec writer writes straight into the checkpoint's
directory, so a save that dies part-way leaves a mixture: files of the new
save beside the previous ``.metadata``, or no ``.metadata`` at all.

:class:`CheckpointWriter` is DCP's fsspec writer with one change: every rank
writes into a staging directory beside the checkpoint (``.NAME.staging``),
and when the coordinator has written ``.metadata`` there it publishes the
whole directory in one metaserver transaction: a rename when the checkpoint
is new, an exchange of the two directories (``EmberFileSystem.exchange``)
when it replaces one. Only then is the previous checkpoint, now under the
staging name, removed. A save killed at any point (``kill -9`` of any rank)
leaves the checkpoint's path holding the previous checkpoint or the new one,
complete; a leftover staging directory is cleared by the next save to the
same path. Loading needs nothing special: DCP's ``FsspecReader`` reads it.

One save to a given path runs at a time (the coordinator clears the staging
directory when it plans a save). Saves must use collectives (DCP's default),
so that one coordinator publishes the checkpoint once every rank has written.

``sync_files`` defaults to False: a file on EmberFS is on every replica of
its chains when ``close()`` returns, so there is nothing for an fsync to wait
for (and an EmberFS stream has no file descriptor to fsync).
"""

from __future__ import annotations

import os

from torch.distributed.checkpoint.fsspec_filesystem import FsspecWriter

METADATA = ".metadata"


def staging_path(path: str | os.PathLike) -> str:
    """The staging directory of a checkpoint path: ``.NAME.staging`` beside it."""
    text = os.fspath(path)
    scheme, netloc, rest = "", "", text
    if "://" in text:
        scheme, _, rest = text.partition("://")
        netloc, _, rest = rest.partition("/")
        scheme, rest = f"{scheme}://{netloc}", "/" + rest
    head, sep, name = rest.rstrip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise ValueError(f"a checkpoint needs a directory name of its own: {path!r}")
    return f"{scheme}{head}{sep}.{name}.staging"


class CheckpointWriter(FsspecWriter):
    """DCP's fsspec storage writer, publishing each checkpoint whole.

    ``path`` is the checkpoint's directory (an ``emberfs://`` URL or a path of
    the filesystem that ``storage_options`` configure); the other arguments
    are :class:`FsspecWriter`'s. ``overwrite=False`` refuses to replace an
    existing checkpoint.
    """

    def __init__(self, path: str | os.PathLike, *, sync_files: bool = False, **kwargs) -> None:
        self.final_path = os.fspath(path)
        super().__init__(staging_path(path), sync_files=sync_files, **kwargs)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.final_path = os.fspath(checkpoint_id)
            checkpoint_id = staging_path(checkpoint_id)
        super().reset(checkpoint_id)

    @property
    def checkpoint_id(self) -> str | os.PathLike:
        return self.final_path

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        if not kwargs.get("use_collectives", True):
            raise ValueError(
                "CheckpointWriter publishes a checkpoint once every rank has written: "
                "save with collectives (use_collectives=True)"
            )
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)

    def _metadata_exists(self) -> bool:
        # DCP's overwrite check: about the published checkpoint, not the staging directory
        return self.fs.exists(self.fs.concat_path(self.final_path, METADATA))

    def prepare_global_plan(self, plans):
        # The coordinator runs this once every rank has planned (and made the staging
        # directory) and before any rank writes: a leftover of a killed save goes here.
        self.fs.fs.rm(self.path, recursive=True)
        self.fs.mkdir(self.path)
        return super().prepare_global_plan(plans)

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)  # writes .metadata into the staging directory
        fs = self.fs.fs
        if fs.exists(self.final_path):
            fs.exchange(self.path, self.final_path)
            fs.rm(self.path, recursive=True)  # the previous checkpoint
        else:
            fs.mv(self.path, self.final_path)
