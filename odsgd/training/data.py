"""Data for the training scripts: ImageNet .rec files, CIFAR-10 and MNIST files, scikit-learn's
digits and synthetic batches, each sharded by worker rank; and the equal-steps rule.

Equal steps: with dist_sync (and dist_odsgd) every worker must push the same number of times
per epoch, or the one with more batches waits forever for the others. Every worker therefore
runs `steps_per_epoch(total, N, batch)` batches an epoch: the number of full batches in the
*smallest* shard. Shards follow MXNet's indexed RecordIO split (`num_parts`/`part_index` with
an .idx file): part k holds records [k * ceil(total/N), (k+1) * ceil(total/N)), so the last part
is the smallest. The iterators are wrapped in `mx.io.ResizeIter`, which stops every worker at
that count and, should a shard run out first (a .rec without .idx is split by bytes), starts
it over instead of hanging.

All iterators give batches of `data` (NCHW float32) and `softmax_label`; a batch's `pad` counts
the padding samples at its end (evaluation ignores them).
"""
import gzip
import math
import os
import pickle
import struct

import mxnet as mx
import numpy as np

IMAGENET_MEAN_RGB = (123.68, 116.779, 103.939)
IMAGENET_STD_RGB = (58.393, 57.12, 57.375)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)


# -- the equal-steps rule ------------------------------------------------------------------
def shard_bounds(total, num_parts, part):
    """[start, stop) of `part` in MXNet's indexed split of `total` records."""
    chunk = int(math.ceil(total / float(num_parts)))
    start = min(total, part * chunk)
    return start, min(total, start + chunk)


def shard_sizes(total, num_parts):
    return [b - a for a, b in (shard_bounds(total, num_parts, k) for k in range(num_parts))]


def steps_per_epoch(total, num_workers, batch_size):
    """Full batches of `batch_size` in the smallest of `num_workers` shards of `total` samples:
    the batches every worker runs per epoch. Raises ValueError when that is 0."""
    steps = min(shard_sizes(total, num_workers)) // batch_size
    if steps < 1:
        raise ValueError("%d training samples in %d shards leave no full batch of %d per worker;"
                         " use a smaller --batch-size or fewer workers"
                         % (total, num_workers, batch_size))
    return steps


def equal_steps(data_iter, steps):
    """`data_iter` cut (or wrapped around) to exactly `steps` batches an epoch."""
    return mx.io.ResizeIter(data_iter, steps, reset_internal=True)


# -- iterators over arrays in memory -------------------------------------------------------
class ArrayIter(mx.io.DataIter):
    """Full, shuffled batches from arrays in memory (one worker's shard), with an optional
    per-batch augmentation.

    X : uint8 or float array (N, C, H, W); y : labels (N,); transform(batch, rng) -> float32
    batch (normalisation, augmentation); seed: the shuffle order (give each worker its own)."""

    def __init__(self, X, y, batch_size, transform, seed, shuffle=True):
        super(ArrayIter, self).__init__(batch_size)
        self.X, self.y = X, np.asarray(y, dtype=np.float32)
        self.transform = transform
        self.shuffle = shuffle
        self.rng = np.random.RandomState(seed)
        shape = transform(X[:1], np.random.RandomState(0)).shape[1:]
        self.provide_data = [mx.io.DataDesc("data", (batch_size,) + shape, np.float32)]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,), np.float32)]
        self.reset()

    def reset(self):
        self.order = self.rng.permutation(len(self.X)) if self.shuffle else np.arange(len(self.X))
        self.cursor = 0

    def next(self):
        if self.cursor + self.batch_size > len(self.X):
            raise StopIteration
        idx = self.order[self.cursor:self.cursor + self.batch_size]
        self.cursor += self.batch_size
        data = self.transform(self.X[idx], self.rng)
        return mx.io.DataBatch([mx.nd.array(data)], [mx.nd.array(self.y[idx])], pad=0)


def evaluation_iter(X, y, batch_size, transform):
    """Every sample once, in order; the last batch padded (its `pad` says by how many)."""
    data = transform(X, np.random.RandomState(0)).astype(np.float32)
    return mx.io.NDArrayIter(data, np.asarray(y, np.float32), batch_size, shuffle=False,
                             last_batch_handle="pad", label_name="softmax_label")


def array_iterators(train, test, rank, num_workers, batch_size, train_transform,
                    test_transform, seed, with_test):
    """(train_iter over this worker's shard, test_iter or None) for in-memory data sets."""
    X, y = train
    start, stop = shard_bounds(len(X), num_workers, rank)
    train_iter = ArrayIter(X[start:stop], y[start:stop], batch_size, train_transform,
                           seed=seed * 1000 + rank)
    test_iter = evaluation_iter(test[0], test[1], batch_size, test_transform) if with_test \
        else None
    return train_iter, test_iter


def normalize(mean, std, scale):
    """transform: x * scale, then (x - mean) / std per channel."""
    mean = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(std, np.float32).reshape(1, -1, 1, 1)

    def transform(batch, _rng):
        return (batch.astype(np.float32) * scale - mean) / std
    return transform


def pad_crop_flip(base, pad=4):
    """transform: GluonCV's CIFAR augmentation (random crop of the image padded by `pad`,
    random left-right flip), then `base`."""
    def transform(batch, rng):
        n, _, h, w = batch.shape
        padded = np.pad(batch, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="constant")
        out = np.empty_like(batch)
        tops = rng.randint(0, 2 * pad + 1, n)
        lefts = rng.randint(0, 2 * pad + 1, n)
        flips = rng.rand(n) < 0.5
        for i in range(n):
            crop = padded[i, :, tops[i]:tops[i] + h, lefts[i]:lefts[i] + w]
            out[i] = crop[:, :, ::-1] if flips[i] else crop
        return base(out, rng)
    return transform


# -- synthetic data ------------------------------------------------------------------------
class SyntheticIter(mx.io.DataIter):
    """`steps` batches of one fixed random batch (data of `shape` per sample, labels in
    [0, num_classes)): throughput and plumbing without files. Nothing to learn."""

    def __init__(self, batch_size, shape, num_classes, steps, seed, dtype="float32"):
        super(SyntheticIter, self).__init__(batch_size)
        rng = np.random.RandomState(seed)
        self.batch = mx.io.DataBatch(
            [mx.nd.array(rng.uniform(-1, 1, (batch_size,) + tuple(shape)), dtype=dtype)],
            [mx.nd.array(rng.randint(0, num_classes, batch_size))], pad=0)
        self.steps = steps
        self.provide_data = [mx.io.DataDesc("data", (batch_size,) + tuple(shape), dtype)]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,), np.float32)]
        self.count = 0

    def reset(self):
        self.count = 0

    def next(self):
        if self.count >= self.steps:
            raise StopIteration
        self.count += 1
        return self.batch


# -- ImageNet in RecordIO ------------------------------------------------------------------
def count_records(idx_path):
    """Records listed in an .idx file (one line each)."""
    with open(idx_path) as f:
        return sum(1 for line in f if line.strip())


def imagenet_iterators(args, rank, num_workers, batch_size, with_val):
    """GluonCV's get_data_rec: train with random resized crops, flips, colour jitter and
    lighting noise, this worker's part of --rec-train (num_parts/part_index); val resized to
    input_size / crop_ratio and centre-cropped (None unless with_val)."""
    jitter, lighting = 0.4, 0.1
    input_size = args.input_size
    normalization = dict(mean_r=IMAGENET_MEAN_RGB[0], mean_g=IMAGENET_MEAN_RGB[1],
                         mean_b=IMAGENET_MEAN_RGB[2], std_r=IMAGENET_STD_RGB[0],
                         std_g=IMAGENET_STD_RGB[1], std_b=IMAGENET_STD_RGB[2])
    index = dict(path_imgidx=args.rec_train_idx) if args.rec_train_idx else {}
    train = mx.io.ImageRecordIter(
        path_imgrec=args.rec_train, preprocess_threads=args.num_workers, shuffle=True,
        batch_size=batch_size, data_shape=(3, input_size, input_size), rand_mirror=True,
        random_resized_crop=True, max_aspect_ratio=4.0 / 3.0, min_aspect_ratio=3.0 / 4.0,
        max_random_area=1, min_random_area=0.08, brightness=jitter, saturation=jitter,
        contrast=jitter, pca_noise=lighting, num_parts=num_workers,
        part_index=rank, seed=args.seed * 1000 + rank, dtype="float32",
        **dict(index, **normalization))
    val = None
    if with_val:
        val_index = dict(path_imgidx=args.rec_val_idx) if args.rec_val_idx else {}
        val = mx.io.ImageRecordIter(
            path_imgrec=args.rec_val, preprocess_threads=args.num_workers, shuffle=False,
            batch_size=batch_size, resize=int(math.ceil(input_size / args.crop_ratio)),
            data_shape=(3, input_size, input_size), round_batch=True,
            **dict(val_index, **normalization))
    return train, val


# -- CIFAR-10 ------------------------------------------------------------------------------
CIFAR_TRAIN_FILES = ["data_batch_%d" % i for i in range(1, 6)]


def find_cifar10(data_dir):
    """(folder, 'python' or 'binary') of the CIFAR-10 files under data_dir (the folder itself
    or its cifar-10-batches-py / cifar-10-batches-bin), or None."""
    for folder in (data_dir, os.path.join(data_dir, "cifar-10-batches-py"),
                   os.path.join(data_dir, "cifar-10-batches-bin")):
        if all(os.path.exists(os.path.join(folder, name)) for name in
               CIFAR_TRAIN_FILES + ["test_batch"]):
            return folder, "python"
        if all(os.path.exists(os.path.join(folder, name + ".bin")) for name in
               CIFAR_TRAIN_FILES + ["test_batch"]):
            return folder, "binary"
    return None


def _read_cifar_python(path):
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return data, np.asarray(batch[b"labels"], dtype=np.int64)


def _read_cifar_binary(path):
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 1 + 3 * 32 * 32)
    return raw[:, 1:].reshape(-1, 3, 32, 32), raw[:, 0].astype(np.int64)


def load_cifar10(data_dir):
    """((X_train, y_train), (X_test, y_test)) from the standard CIFAR-10 files (python or
    binary version): X uint8 (N, 3, 32, 32), y int64 in [0, 10)."""
    found = find_cifar10(data_dir)
    if found is None:
        raise FileNotFoundError(
            "no CIFAR-10 files under %r: expected data_batch_1..5 and test_batch (python "
            "version, cifar-10-batches-py) or the same with .bin (binary version), from "
            "https://www.cs.toronto.edu/~kriz/cifar.html; give --data-dir, or --synthetic"
            % data_dir)
    folder, kind = found
    read = _read_cifar_python if kind == "python" else _read_cifar_binary
    suffix = "" if kind == "python" else ".bin"
    parts = [read(os.path.join(folder, name + suffix)) for name in CIFAR_TRAIN_FILES]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return train, read(os.path.join(folder, "test_batch" + suffix))


# -- MNIST ---------------------------------------------------------------------------------
MNIST_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
               "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def _mnist_path(data_dir, name):
    for candidate in (name, name + ".gz", name.replace("-idx", ".idx")):
        path = os.path.join(data_dir, candidate)
        if os.path.exists(path):
            return path
    return None


def read_idx(path):
    """An IDX file (MNIST's format, optionally gzipped) as a NumPy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        zero, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype_code != 0x08:
            raise ValueError("%s is not an unsigned-byte IDX file" % path)
        shape = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def load_mnist(data_dir):
    """((X_train, y_train), (X_test, y_test)) from the four standard MNIST IDX files
    (plain or .gz) in data_dir: X uint8 (N, 1, 28, 28)."""
    paths = {key: _mnist_path(data_dir, name) for key, name in MNIST_FILES.items()}
    missing = [MNIST_FILES[key] for key, path in paths.items() if path is None]
    if missing:
        raise FileNotFoundError(
            "no MNIST files in %r (missing %s, plain or .gz, from "
            "http://yann.lecun.com/exdb/mnist/); give --data-dir, or use --digits "
            "(scikit-learn's 8x8 digits) or --synthetic" % (data_dir, ", ".join(missing)))
    arrays = {key: read_idx(path) for key, path in paths.items()}

    def images(a):
        return a.reshape(a.shape[0], 1, a.shape[1], a.shape[2])
    return ((images(arrays["train_images"]), arrays["train_labels"].astype(np.int64)),
            (images(arrays["test_images"]), arrays["test_labels"].astype(np.int64)))


# -- scikit-learn digits -------------------------------------------------------------------
def load_digits():
    """((X_train, y_train), (X_test, y_test)): scikit-learn's 1797 bundled 8x8 digits,
    X float32 (N, 1, 8, 8) in [0, 1], split 80/20 with a fixed permutation (the same on every
    worker and in odsgd.bench.digits_job)."""
    from sklearn.datasets import load_digits as sklearn_digits
    data = sklearn_digits()
    X = (data.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = data.target.astype(np.int64)
    order = np.random.RandomState(1234).permutation(len(X))
    X, y = X[order], y[order]
    cut = int(0.8 * len(X))
    return (X[:cut], y[:cut]), (X[cut:], y[cut:])
