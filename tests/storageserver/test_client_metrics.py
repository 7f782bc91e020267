"""Bytes per client on the storage servers: what a client reads and writes, counted once."""

from __future__ import annotations

import os
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from emberfs.client.fs import EmberFileSystem
from emberfs.storageserver.metrics import ClientLabels

MiB = 1024 * 1024


def _client_bytes(cluster, client: str = "127.0.0.1") -> tuple[float, float]:
    """(bytes read, bytes written) by ``client`` summed over every storage server."""
    read = written = 0.0
    for i in range(len(cluster.storage)):
        with urllib.request.urlopen(cluster.storage_metrics_url(i), timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("client") != client or not sample.name.endswith("_total"):
                    continue
                if sample.name == "emberfs_storage_client_read_bytes_total":
                    read += sample.value
                elif sample.name == "emberfs_storage_client_written_bytes_total":
                    written += sample.value
    return read, written


def test_a_clients_bytes_count_once_not_per_replica(cluster):
    """Chain replication stores each write three times; the client sent it once."""
    data = os.urandom(9 * MiB + 321)  # three chunks, the last one short
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        read0, written0 = _client_bytes(cluster)
        fs.pipe_file("/client-metrics/f.bin", data)
        read1, written1 = _client_bytes(cluster)
        assert written1 - written0 == len(data)
        assert read1 == read0
        assert fs.cat_file("/client-metrics/f.bin") == data
        read2, written2 = _client_bytes(cluster)
        assert read2 - read1 == len(data)
        assert written2 == written1
    finally:
        fs.close()


def test_client_labels_are_bounded():
    labels = ClientLabels(limit=2)
    assert labels.label("10.0.0.1") == "10.0.0.1"
    assert labels.label("10.0.0.2") == "10.0.0.2"
    assert labels.label("10.0.0.3") == ClientLabels.OTHER
    assert labels.label("10.0.0.1") == "10.0.0.1"  # named ones keep their label
    assert labels.label("10.0.0.4") == ClientLabels.OTHER
