#!/usr/bin/env python
"""Trains MXNet's MNIST networks (mlp, lenet) with dist_sync, dist_async or OD-SGD
(dist_odsgd), from the standard MNIST files, or scikit-learn's bundled 8x8 digits (--digits).

    python -m odsgd.launch -n 2 -s 1 --launcher local \\
        python examples/train_mnist.py --data-dir data/mnist --kvstore dist_odsgd

With `--max-restarts N --checkpoint-dir DIR` before the command and `--save-every-steps K
--resume auto` in it, a job that fails is started again and goes on from its newest whole
checkpoint, as if uninterrupted.

--data-dir holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte (plain or .gz). Without them the script stops, unless --digits (real
data, offline) or --synthetic is given.
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import odsgd  # noqa: E402,F401  (registers dist_odsgd; imports nothing on servers)
import mxnet as mx  # noqa: E402  (on a server or scheduler the job's server loop runs in here)

from odsgd.training import data, networks, options, session  # noqa: E402

MNIST_TRAINING_SAMPLES = 60000


def parse_args(argv=None):
    parser = options.build_parser(
        __doc__.splitlines()[0], model="mlp", batch_size=64, num_epochs=20, lr=0.05,
        lr_mode="step", lr_decay_epoch="10", wd=1e-4, log_interval=100)
    group = parser.add_argument_group("MNIST data")
    group.add_argument("--data-dir", default="data/mnist")
    group.add_argument("--digits", action="store_true",
                       help="scikit-learn's 1797 bundled 8x8 digits instead of MNIST")
    args = parser.parse_args(argv)
    args.data_dir = os.path.expanduser(args.data_dir)
    try:
        options.check_arguments(args)
        if args.digits and args.synthetic:
            raise ValueError("give --digits or --synthetic, not both")
        if not (args.digits or args.synthetic):
            mnist(args.data_dir)   # raises, naming the missing files
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    return args


@functools.lru_cache(maxsize=1)
def mnist(data_dir):
    return data.load_mnist(data_dir)


def dataset(args):
    return data.load_digits() if args.digits else mnist(args.data_dir)


def sample_shape(args):
    return (1, 8, 8) if args.digits else (1, 28, 28)


def training_size(args):
    if args.synthetic:
        return args.num_training_samples or MNIST_TRAINING_SAMPLES
    return len(dataset(args)[0][0])


def make_iterators(args, rank, num_workers, batch_size, with_val):
    if args.synthetic:
        steps = data.steps_per_epoch(training_size(args), num_workers, batch_size)
        train = data.SyntheticIter(batch_size, sample_shape(args), 10, steps, args.seed + rank)
        val = data.SyntheticIter(batch_size, sample_shape(args), 10, 2, args.seed) \
            if with_val else None
        return train, val
    # MNIST bytes to [0, 1]; the digits are in [0, 1] already
    transform = data.normalize((0.0,), (1.0,), 1.0 if args.digits else 1.0 / 255)
    train, test = dataset(args)
    return data.array_iterators(train, test, rank, num_workers, batch_size, transform,
                                transform, args.seed, with_val)


TASK = session.Task(
    "mnist", num_classes=lambda args: 10,
    training_size=training_size, make_iterators=make_iterators,
    make_net=lambda args: networks.mnist_net(args.model),
    initializer=lambda args: mx.init.Xavier())


def main(argv=None):
    return session.train(TASK, parse_args(argv))


if __name__ == "__main__":
    main()
