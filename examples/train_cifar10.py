#!/usr/bin/env python
"""Trains a CIFAR-10 ResNet of GluonCV's model zoo (cifar_resnet20_v1, cifar_resnet56_v1, ...)
with dist_sync, dist_async or OD-SGD (dist_odsgd), from the standard CIFAR-10 files.

    python -m odsgd.launch -n 4 -s 1 --launcher local \\
        python examples/train_cifar10.py --data-dir ~/.mxnet/datasets/cifar10 --kvstore dist_odsgd

A job that survives failures, exactly (checkpoints every 500 steps, the job started again
up to 3 times, each attempt going on from the newest whole checkpoint):

    python -m odsgd.launch -n 4 -s 1 --launcher local --max-restarts 3 --checkpoint-dir ckpt \\
        python examples/train_cifar10.py --kvstore dist_odsgd \\
        --save-every-steps 500 --keep-checkpoints 3 --resume auto

--data-dir holds the python version (data_batch_1..5, test_batch; or its
cifar-10-batches-py folder) or the binary version (*.bin). `--synthetic` runs without files.
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import odsgd  # noqa: E402,F401  (registers dist_odsgd; imports nothing on servers)
import mxnet as mx  # noqa: E402  (on a server or scheduler the job's server loop runs in here)

from odsgd.training import data, networks, options, session  # noqa: E402

CIFAR_TRAINING_SAMPLES = 50000


def parse_args(argv=None):
    parser = options.build_parser(
        __doc__.splitlines()[0], model="cifar_resnet20_v1", batch_size=128, num_epochs=200,
        lr=0.1, lr_mode="step", lr_decay_epoch="100,150", wd=1e-4, log_interval=50,
        optimizer="nag")
    parser.add_argument_group("CIFAR-10 data").add_argument(
        "--data-dir", default="~/.mxnet/datasets/cifar10")
    args = parser.parse_args(argv)
    args.data_dir = os.path.expanduser(args.data_dir)
    try:
        options.check_arguments(args)
        if not args.synthetic and data.find_cifar10(args.data_dir) is None:
            data.load_cifar10(args.data_dir)   # raises, naming the files it looked for
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    return args


@functools.lru_cache(maxsize=1)
def cifar10(data_dir):
    return data.load_cifar10(data_dir)


def training_size(args):
    if args.synthetic:
        return args.num_training_samples or CIFAR_TRAINING_SAMPLES
    return len(cifar10(args.data_dir)[0][0])


def make_iterators(args, rank, num_workers, batch_size, with_val):
    if args.synthetic:
        steps = data.steps_per_epoch(training_size(args), num_workers, batch_size)
        train = data.SyntheticIter(batch_size, (3, 32, 32), 10, steps, args.seed + rank)
        val = data.SyntheticIter(batch_size, (3, 32, 32), 10, 2, args.seed) if with_val else None
        return train, val
    test_transform = data.normalize(data.CIFAR_MEAN, data.CIFAR_STD, 1.0 / 255)
    train, test = cifar10(args.data_dir)
    return data.array_iterators(train, test, rank, num_workers, batch_size,
                                data.pad_crop_flip(test_transform), test_transform,
                                args.seed, with_val)


TASK = session.Task(
    "cifar10", num_classes=lambda args: 10,
    training_size=training_size, make_iterators=make_iterators,
    make_net=lambda args: networks.model_zoo_net(args.model, 10),
    initializer=lambda args: mx.init.Xavier())


def main(argv=None):
    return session.train(TASK, parse_args(argv))


if __name__ == "__main__":
    main()
