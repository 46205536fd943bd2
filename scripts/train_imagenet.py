#!/usr/bin/env python
"""Trains an ImageNet network of GluonCV's model zoo (resnet50_v1, resnet50_v1b, resnet18_v1,
...) with dist_sync, dist_async or OD-SGD (dist_odsgd), from RecordIO files sharded by rank.

    python -m odsgd.launch -n 4 -s 4 -H hosts --launcher ssh \\
        python scripts/train_imagenet.py --rec-train train.rec --rec-train-idx train.idx \\
        --rec-val val.rec --rec-val-idx val.idx --model resnet50_v1 --num-gpus 4 \\
        --batch-size 64 --kvstore dist_odsgd

docs/reproduce.md has the paper's runs; `--synthetic` runs without data.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import odsgd  # noqa: E402,F401  (registers dist_odsgd; imports nothing on servers)
import mxnet as mx  # noqa: E402  (on a server or scheduler the job's server loop runs in here)

from odsgd.training import data, networks, options, session  # noqa: E402

IMAGENET_TRAINING_SAMPLES = 1281167


def parse_args(argv=None):
    parser = options.build_parser(
        __doc__.splitlines()[0], model="resnet50_v1", batch_size=32, num_epochs=120, lr=0.1,
        lr_mode="step", lr_decay_epoch="30,60,90", wd=1e-4, log_interval=50)
    group = parser.add_argument_group("ImageNet data")
    group.add_argument("--rec-train", default="~/.mxnet/datasets/imagenet/rec/train.rec")
    group.add_argument("--rec-train-idx", default="~/.mxnet/datasets/imagenet/rec/train.idx",
                       help="index of --rec-train: counts the records and shards them "
                       "exactly (give '' for a .rec without index, with "
                       "--num-training-samples)")
    group.add_argument("--rec-val", default="~/.mxnet/datasets/imagenet/rec/val.rec")
    group.add_argument("--rec-val-idx", default="~/.mxnet/datasets/imagenet/rec/val.idx")
    group.add_argument("--input-size", type=int, default=224)
    group.add_argument("--crop-ratio", type=float, default=0.875,
                       help="validation: resize to input-size / crop-ratio, centre crop")
    group.add_argument("--num-classes", type=int, default=1000)
    args = parser.parse_args(argv)
    for name in ("rec_train", "rec_train_idx", "rec_val", "rec_val_idx"):
        setattr(args, name, os.path.expanduser(getattr(args, name)) if getattr(args, name)
                else "")
    try:
        options.check_arguments(args)
        if not args.synthetic:
            check_files(args)
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    return args


def check_files(args):
    for flag, path in (("--rec-train", args.rec_train), ("--rec-train-idx", args.rec_train_idx),
                       ("--rec-val", args.rec_val), ("--rec-val-idx", args.rec_val_idx)):
        if path and not os.path.exists(path):
            raise FileNotFoundError("%s %s does not exist (make it with MXNet's "
                                    "tools/im2rec.py, or use --synthetic)" % (flag, path))
    if not args.rec_train_idx and not args.num_training_samples:
        raise ValueError("without --rec-train-idx give --num-training-samples")


def training_size(args):
    if args.synthetic:
        return args.num_training_samples or IMAGENET_TRAINING_SAMPLES
    if args.rec_train_idx:
        return data.count_records(args.rec_train_idx)
    return args.num_training_samples


def make_iterators(args, rank, num_workers, batch_size, with_val):
    if args.synthetic:
        shape = (3, args.input_size, args.input_size)
        steps = data.steps_per_epoch(training_size(args), num_workers, batch_size)
        train = data.SyntheticIter(batch_size, shape, args.num_classes, steps, args.seed + rank)
        val = data.SyntheticIter(batch_size, shape, args.num_classes, 2, args.seed) \
            if with_val else None
        return train, val
    return data.imagenet_iterators(args, rank, num_workers, batch_size, with_val)


TASK = session.Task(
    "imagenet", num_classes=lambda args: args.num_classes,
    training_size=training_size, make_iterators=make_iterators,
    make_net=lambda args: networks.model_zoo_net(args.model, args.num_classes),
    initializer=lambda args: mx.init.MSRAPrelu())


def main(argv=None):
    return session.train(TASK, parse_args(argv))


if __name__ == "__main__":
    main()
