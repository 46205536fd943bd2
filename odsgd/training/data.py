"""Data for the training scripts: ImageNet .rec files or image folder, CIFAR-10 and MNIST files,
scikit-learn's digits and synthetic batches, each sharded by worker rank; and the equal-steps
rule.

Equal steps: with dist_sync (and dist_odsgd) every worker must push the same number of times
per epoch, or the one with more batches waits forever for the others. Every worker therefore
runs `steps_per_epoch(total, N, batch)` batches an epoch: the number of full batches in the
*smallest* shard. Shards follow MXNet's indexed RecordIO split (`num_parts`/`part_index` with
an .idx file): part k holds records [k * ceil(total/N), (k+1) * ceil(total/N)), so the last part
is the smallest. The iterators are wrapped in `EpochBatches`, which stops every worker at
that count and, should a shard run out first (a .rec without .idx is split by bytes), starts
it over instead of hanging.

Resuming exactly: every random draw of the data (the shuffle, CIFAR's pad-crop-flip, the image
folder's augmentation) comes from a stream keyed by (seed, rank, epoch and batch):
`stream`. What batch b of epoch e holds therefore does not depend on what ran before, and an
iterator started at batch b of epoch e (`EpochBatches.start_epoch(e, skip=b)`) gives what the
uninterrupted run gave from there. The in-memory ArrayIter, SyntheticIter and the image
folder's LoaderIter can start anywhere; MXNet's ImageRecordIter only at an epoch's start (it
is made anew each epoch with the epoch's seed: `EpochRecordIter`).

All iterators give batches of `data` (NCHW float32) and `softmax_label`; a batch's `pad` counts
the padding samples at its end (evaluation ignores them).
"""
import gzip
import math
import os
import pickle
import random
import struct

import mxnet as mx
import numpy as np

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


def resized_to(data_iter, steps):
    """`data_iter` cut (or wrapped around) to exactly `steps` batches an epoch."""
    return EpochBatches(data_iter, steps)


# -- random streams keyed by position: what a resumed run draws again ----------------------
#: what a stream is for; the first entry of its key, so that no two purposes share draws
ORDER, AUGMENTATION, MIXUP, NETWORK = range(4)


def stream_seed(purpose, seed, rank, epoch, position=0):
    """A 32-bit seed for the draws of `purpose` on worker `rank` at `position` (a batch) of
    `epoch`, in the run of --seed `seed`: the same whatever ran
    before, so that a run resumed at any batch draws what the uninterrupted run drew there.
    The key has a fixed length: NumPy's SeedSequence gives [a, b] and [a, b, 0] one state."""
    key = [int(purpose), int(seed) % 2 ** 32, int(rank), int(epoch), int(position)]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


def stream(purpose, seed, rank, epoch, position=0):
    """np.random.RandomState of stream_seed(...)."""
    return np.random.RandomState(stream_seed(purpose, seed, rank, epoch, position))


def can_start_mid_epoch(data_iter):
    """Whether `data_iter` can start at any batch of an epoch (start_epoch with skip > 0)."""
    return getattr(data_iter, "starts_mid_epoch", False)


class EpochBatches(mx.io.DataIter):
    """Exactly `steps` batches an epoch of `source` (one worker's shard), from any batch of
    any epoch where the source can start there.

    start_epoch(epoch, skip) positions it at batch `skip` of `epoch`; reset() goes on with the
    next epoch (what Module.fit calls between epochs). A source without start_epoch (any
    mx.io iterator) is reset at each epoch's start and can only start at batch 0."""

    def __init__(self, source, steps):
        super(EpochBatches, self).__init__(source.batch_size)
        self.source, self.steps = source, steps
        self.provide_data, self.provide_label = source.provide_data, source.provide_label
        self.epoch, self.done = 0, 0

    @property
    def starts_mid_epoch(self):
        return can_start_mid_epoch(self.source)

    def start_epoch(self, epoch, skip=0):
        if skip and not self.starts_mid_epoch:
            raise ValueError("%s can only start at an epoch's first batch, not at batch %d"
                             % (type(self.source).__name__, skip))
        if not 0 <= skip <= self.steps:
            raise ValueError("batch %d is outside an epoch of %d" % (skip, self.steps))
        if hasattr(self.source, "start_epoch"):
            self.source.start_epoch(epoch, skip)
        else:
            self.source.reset()
        self.epoch, self.done = epoch, skip

    def reset(self):
        self.start_epoch(self.epoch + 1)

    def next(self):
        if self.done >= self.steps:
            raise StopIteration
        try:
            batch = self.source.next()
        except StopIteration:
            if self.starts_mid_epoch:
                # a shard of these holds every batch of the equal-steps count: running short
                # means the count or the shard is wrong, and a wrap would break the replay
                raise RuntimeError("%s ran out after %d of %d batches of epoch %d"
                                   % (type(self.source).__name__, self.done, self.steps,
                                      self.epoch)) from None
            self.source.reset()
            batch = self.source.next()
        self.done += 1
        return batch


# -- iterators over arrays in memory -------------------------------------------------------
class ArrayIter(mx.io.DataIter):
    """Full, shuffled batches from arrays in memory (one worker's shard), with an optional
    per-batch augmentation; it can start at any batch of any epoch (start_epoch).

    X : uint8 or float array (N, C, H, W); y : labels (N,); transform(batch, rng) -> float32
    batch (normalisation, augmentation); seed, rank: the keys of its streams (`stream`): epoch
    e's order is drawn from (seed, rank, e), batch b's augmentation from (seed, rank, e, b)."""

    #: start_epoch(epoch, skip) replays any batch of any epoch
    starts_mid_epoch = True

    def __init__(self, X, y, batch_size, transform, seed, shuffle=True, rank=0):
        super(ArrayIter, self).__init__(batch_size)
        self.X, self.y = X, np.asarray(y, dtype=np.float32)
        self.transform = transform
        self.shuffle, self.seed, self.rank = shuffle, seed, rank
        shape = transform(X[:1], np.random.RandomState(0)).shape[1:]
        self.provide_data = [mx.io.DataDesc("data", (batch_size,) + shape, np.float32)]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,), np.float32)]
        self.epoch = -1
        self.reset()

    def reset(self):
        """The next epoch."""
        self.start_epoch(self.epoch + 1)

    def start_epoch(self, epoch, skip=0):
        """Batch `skip` of `epoch` comes next."""
        self.epoch, self.batch_index = epoch, skip
        self.order = stream(ORDER, self.seed, self.rank, epoch).permutation(len(self.X)) \
            if self.shuffle else np.arange(len(self.X))

    def next(self):
        start = self.batch_index * self.batch_size
        if start + self.batch_size > len(self.X):
            raise StopIteration
        idx = self.order[start:start + self.batch_size]
        data = self.transform(self.X[idx], stream(AUGMENTATION, self.seed, self.rank,
                                                  self.epoch, self.batch_index))
        self.batch_index += 1
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
                           seed=seed, rank=rank)
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

    #: every batch is the same one: any batch of any epoch can come next
    starts_mid_epoch = True

    def reset(self):
        self.count = 0

    def start_epoch(self, _epoch, skip=0):
        self.count = skip

    def next(self):
        if self.count >= self.steps:
            raise StopIteration
        self.count += 1
        return self.batch


# -- ImageNet: RecordIO files or an image folder, as GluonCV's train_imagenet.py reads them --
#: GluonCV's normalisation of its RecordIO path (get_data_rec), on the 0..255 scale
IMAGENET_MEAN_RGB = (123.68, 116.779, 103.939)
IMAGENET_STD_RGB = (58.393, 57.12, 57.375)
#: ... and of its image-folder path (transforms.Normalize after ToTensor), on the 0..1 scale
IMAGENET_FOLDER_MEAN = (0.485, 0.456, 0.406)
IMAGENET_FOLDER_STD = (0.229, 0.224, 0.225)
#: GluonCV's colour jitter (brightness, contrast, saturation) and PCA lighting noise
IMAGENET_JITTER, IMAGENET_LIGHTING = 0.4, 0.1


def count_records(idx_path):
    """Records listed in an .idx file (one line each)."""
    with open(idx_path) as f:
        return sum(1 for line in f if line.strip())


def imagenet_normalization(args, folder=False):
    """(mean, std) per RGB channel: --rgb-mean / --rgb-std (0..255 scale) where given, else
    GluonCV's own for the RecordIO path (0..255) or the image-folder path (0..1, which
    GluonCV applies after scaling the pixels to [0, 1]; given flags are divided by 255)."""
    mean, std = getattr(args, "rgb_mean", None), getattr(args, "rgb_std", None)
    if folder:
        return (tuple(m / 255.0 for m in mean) if mean else IMAGENET_FOLDER_MEAN,
                tuple(s / 255.0 for s in std) if std else IMAGENET_FOLDER_STD)
    return tuple(mean or IMAGENET_MEAN_RGB), tuple(std or IMAGENET_STD_RGB)


def validation_resize(args):
    """The shorter side validation images are resized to before the centre crop."""
    return int(math.ceil(args.input_size / args.crop_ratio))


def imagenet_iterators(args, rank, num_workers, batch_size, with_val):
    """GluonCV's get_data_rec: train with random resized crops, flips, colour jitter and
    lighting noise, this worker's part of --rec-train (num_parts/part_index); val resized to
    input_size / crop_ratio and centre-cropped (None unless with_val); both normalised with
    imagenet_normalization."""
    input_size = args.input_size
    mean, std = imagenet_normalization(args)
    normalization = dict(mean_r=mean[0], mean_g=mean[1], mean_b=mean[2],
                         std_r=std[0], std_g=std[1], std_b=std[2])
    index = dict(path_imgidx=args.rec_train_idx) if args.rec_train_idx else {}
    def make_train(seed):
        return mx.io.ImageRecordIter(
            path_imgrec=args.rec_train, preprocess_threads=args.num_workers, shuffle=True,
            batch_size=batch_size, data_shape=(3, input_size, input_size), rand_mirror=True,
            random_resized_crop=True, max_aspect_ratio=4.0 / 3.0, min_aspect_ratio=3.0 / 4.0,
            max_random_area=1, min_random_area=0.08, brightness=IMAGENET_JITTER,
            saturation=IMAGENET_JITTER, contrast=IMAGENET_JITTER, pca_noise=IMAGENET_LIGHTING,
            num_parts=num_workers, part_index=rank, seed=seed, dtype="float32",
            **dict(index, **normalization))
    train = EpochRecordIter(make_train, args.seed, rank)
    val = None
    if with_val:
        val_index = dict(path_imgidx=args.rec_val_idx) if args.rec_val_idx else {}
        val = mx.io.ImageRecordIter(
            path_imgrec=args.rec_val, preprocess_threads=args.num_workers, shuffle=False,
            batch_size=batch_size, resize=validation_resize(args),
            data_shape=(3, input_size, input_size), round_batch=True,
            **dict(val_index, **normalization))
    return train, val


class EpochRecordIter(mx.io.DataIter):
    """An MXNet iterator (ImageRecordIter) made anew at each epoch's start by `make(seed)`,
    with the epoch's seed (stream ORDER of (seed, rank, epoch)).

    Why anew: ImageRecordIter shuffles and augments from its own generator, seeded once and
    carried on from epoch to epoch inside one process, so a job resumed at epoch e would
    draw epoch 0's order again. Made with epoch e's seed, it draws what the uninterrupted
    run drew in epoch e (measured: the same seed gives the same batches, with 1 and 4
    decoding threads). It cannot start mid-epoch: it would have to decode the batches it
    skips."""

    starts_mid_epoch = False

    def __init__(self, make, seed, rank):
        self.make, self.seed, self.rank = make, seed, rank
        self.epoch = 0
        self.inner = make(self._seed(0))
        self.unread = True          # made for epoch 0 and not read yet
        super(EpochRecordIter, self).__init__(self.inner.batch_size)
        self.provide_data, self.provide_label = self.inner.provide_data, \
            self.inner.provide_label

    def _seed(self, epoch):
        # ImageRecordIter's seed is a C int
        return stream_seed(ORDER, self.seed, self.rank, epoch) % (2 ** 31 - 1)

    def start_epoch(self, epoch, skip=0):
        if skip:
            raise ValueError("MXNet's ImageRecordIter (--use-rec) can only start at an "
                             "epoch's first batch, not at batch %d" % skip)
        if epoch != self.epoch or not self.unread:
            self.inner = None       # its decoding threads end before the next one's start
            self.inner = self.make(self._seed(epoch))
        self.epoch, self.unread = epoch, True

    def reset(self):
        """Starts the epoch's shard over (EpochBatches, where a shard runs out first)."""
        self.inner.reset()

    def next(self):
        self.unread = False
        return self.inner.next()


def imagenet_folder(data_dir, train):
    """GluonCV's ImageNet data set: the class folders of DATA_DIR/train or DATA_DIR/val."""
    from gluoncv.data.imagenet.classification import ImageNet
    return ImageNet(data_dir, train=train)


def imagenet_folder_transforms(args):
    """(train, val) transforms of GluonCV's image-folder path (get_data_rec_transfomed):
    random resized crop, flip, colour jitter, lighting, to [0, 1], normalisation; val resize
    (aspect kept), centre crop, to [0, 1], normalisation."""
    from mxnet.gluon.data.vision import transforms
    normalize = transforms.Normalize(*imagenet_normalization(args, folder=True))
    train = transforms.Compose([
        transforms.RandomResizedCrop(args.input_size), transforms.RandomFlipLeftRight(),
        transforms.RandomColorJitter(brightness=IMAGENET_JITTER, contrast=IMAGENET_JITTER,
                                     saturation=IMAGENET_JITTER),
        transforms.RandomLighting(IMAGENET_LIGHTING), transforms.ToTensor(), normalize])
    val = transforms.Compose([
        transforms.Resize(validation_resize(args), keep_ratio=True),
        transforms.CenterCrop(args.input_size), transforms.ToTensor(), normalize])
    return train, val


def folder_shard(count, rank, num_workers, seed=1234):
    """Indices of this worker's shard of an image folder of `count` images: MXNet's indexed
    split (shard_bounds) of one fixed permutation, the same on every worker. The folder lists
    its images class by class; contiguous shards would give each worker only some classes."""
    order = np.random.RandomState(seed).permutation(count)
    start, stop = shard_bounds(count, num_workers, rank)
    return np.sort(order[start:stop])


class _ShardBatches(object):
    """Batches for a gluon DataLoader: `indices` in order with a last short batch (shuffle
    False); or, with shuffle, the full batches of epoch `epoch`'s permutation of them (stream
    ORDER of (seed, rank, epoch)) from batch `skip` on, each a list of items (index, seed),
    the first one's seed that of the batch's augmentation (stream AUGMENTATION of (seed, rank,
    epoch, batch)), the others' None."""

    def __init__(self, indices, batch_size, shuffle, seed, rank):
        self.indices, self.batch_size, self.shuffle = np.asarray(indices), batch_size, shuffle
        self.seed, self.rank = seed, rank
        self.epoch, self.skip = 0, 0

    def __iter__(self):
        size = self.batch_size
        if not self.shuffle:
            for start in range(0, len(self.indices), size):
                yield self.indices[start:start + size].tolist()
            return
        order = stream(ORDER, self.seed, self.rank, self.epoch).permutation(self.indices)
        for batch in range(self.skip, len(order) // size):
            seed = stream_seed(AUGMENTATION, self.seed, self.rank, self.epoch, batch)
            yield [(int(index), seed if place == 0 else None)
                   for place, index in enumerate(order[batch * size:(batch + 1) * size])]

    def __len__(self):
        full, rest = divmod(len(self.indices), self.batch_size)
        return full + (1 if rest and not self.shuffle else 0)


class _SeededItems(mx.gluon.data.Dataset):
    """Items `(index, seed)` of `dataset`, the image transformed by `transform`; a seed that is
    not None first seeds every generator the transform may draw from: Python's (gluon's
    RandomResizedCrop, mx.image's colour jitter), NumPy's and MXNet's (the image operators:
    flip, lighting).

    The DataLoader makes a batch's items in order, in one process (the worker or one of its
    data-loading processes): seeded at its first item, a batch is the same in whichever
    process makes it, and whatever was made before it. Once a batch, not once an item: MXNet's
    seeding takes about a millisecond."""

    def __init__(self, dataset, transform):
        self.dataset, self.transform = dataset, transform

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index, seed = key
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed)
            # the CPU's generator only: the image operators here run on the CPU, and in a
            # data-loading process forked from a GPU worker seeding 'all' devices would
            # touch CUDA, which a forked child cannot use
            mx.random.seed(seed, ctx=mx.cpu())
        image, label = self.dataset[index]
        return self.transform(image), label


class LoaderIter(mx.io.DataIter):
    """A gluon DataLoader over `indices` of `dataset` (items (image, label), the image
    transformed by `transform` to `data_shape`) as an mx.io DataIter: shuffled full batches
    (shuffle=True; seeded by (seed, rank, epoch, batch), so that it can start at any batch of
    any epoch: start_epoch), or every item in order with the last batch padded (its `pad`
    says by how many)."""

    def __init__(self, dataset, transform, indices, batch_size, data_shape, shuffle, seed,
                 num_workers, rank=0):
        super(LoaderIter, self).__init__(batch_size)
        self.sampler = _ShardBatches(indices, batch_size, shuffle, seed, rank)
        items = _SeededItems(dataset, transform) if shuffle else \
            dataset.transform_first(transform)
        self.loader = mx.gluon.data.DataLoader(items, batch_sampler=self.sampler,
                                               num_workers=num_workers)
        self.provide_data = [mx.io.DataDesc("data", (batch_size,) + tuple(data_shape),
                                            np.float32)]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,), np.float32)]
        self.batches = None

    @property
    def starts_mid_epoch(self):
        return self.sampler.shuffle

    def start_epoch(self, epoch, skip=0):
        """Batch `skip` of `epoch` comes next."""
        self.sampler.epoch, self.sampler.skip = epoch, skip
        self.batches = None

    def reset(self):
        """The next epoch."""
        self.start_epoch(self.sampler.epoch + 1)

    def next(self):
        if self.batches is None:
            self.batches = iter(self.loader)
        data, label = next(self.batches)   # StopIteration ends the pass
        pad = self.batch_size - data.shape[0]
        label = label.astype("float32")
        if pad:
            data = mx.nd.concat(data, mx.nd.zeros((pad,) + data.shape[1:], dtype=data.dtype),
                                dim=0)
            label = mx.nd.concat(label, mx.nd.zeros((pad,), dtype="float32"), dim=0)
        return mx.io.DataBatch([data], [label], pad=pad)


def imagenet_folder_iterators(args, rank, num_workers, batch_size, with_val):
    """GluonCV's image-folder path (--data-dir, without --use-rec): this worker's shard of
    DATA_DIR/train (folder_shard) with the training transforms, and DATA_DIR/val in order
    (None unless with_val), each read by --num-data-workers processes."""
    train_transform, val_transform = imagenet_folder_transforms(args)
    shape = (3, args.input_size, args.input_size)
    train_set = imagenet_folder(args.data_dir, train=True)
    train = LoaderIter(train_set, train_transform,
                       folder_shard(len(train_set), rank, num_workers), batch_size, shape,
                       shuffle=True, seed=args.seed, num_workers=args.num_workers, rank=rank)
    val = None
    if with_val:
        val_set = imagenet_folder(args.data_dir, train=False)
        val = LoaderIter(val_set, val_transform, np.arange(len(val_set)), batch_size, shape,
                         shuffle=False, seed=0, num_workers=args.num_workers)
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
