"""pandas and pyarrow through ``emberfs://`` URLs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from emberfs.client.fs import EmberFileSystem


@pytest.fixture
def frame():
    rng = np.random.default_rng(7)
    n = 200_000
    return pd.DataFrame(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": rng.standard_normal(n),
            "label": rng.choice(["cat", "dog", "emu"], n),
        }
    )


def test_parquet_round_trip_through_url(cluster, base, frame):
    url = f"emberfs://{cluster.meta_address}{base}/table.parquet"
    frame.to_parquet(url, row_group_size=50_000)
    back = pd.read_parquet(url)
    pd.testing.assert_frame_equal(back, frame)
    subset = pd.read_parquet(url, columns=["x"])
    pd.testing.assert_series_equal(subset["x"], frame["x"])


def test_pyarrow_reads_footer_and_row_groups_without_full_readahead(cluster, base, frame):
    fs = EmberFileSystem(cluster.meta_address, skip_instance_cache=True)
    path = f"{base}/rg.parquet"
    with fs.open(path, "wb") as f:
        frame.to_parquet(f, row_group_size=20_000)
    size = fs.info(path)["size"]
    with fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups == 10
        table = pf.read_row_group(3, columns=["id"])
        assert table.column("id").to_pylist() == list(range(60_000, 80_000))
        # footer and one column chunk: far less than the file was fetched
        assert f.cache.total_requested_bytes < size // 2
    fs.close()


def test_csv_text_through_url(cluster, base, frame):
    url = f"emberfs://{cluster.meta_address}{base}/t.csv"
    frame.head(1000).to_csv(url, index=False)
    pd.testing.assert_frame_equal(pd.read_csv(url), frame.head(1000))
