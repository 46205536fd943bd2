#!/usr/bin/env python
"""Trains an ImageNet network of GluonCV's model zoo (resnet50_v1, resnet50_v1b, resnet18_v1,
...) with dist_sync, dist_async or OD-SGD (dist_odsgd), from RecordIO files or the image folder,
sharded by rank, with GluonCV's recipe flags.

    python -m odsgd.launch -n 4 -s 4 -H hosts --launcher ssh \\
        python examples/train_imagenet.py --use-rec --rec-train train.rec \\
        --rec-train-idx train.idx --rec-val val.rec --rec-val-idx val.idx \\
        --model resnet50_v1b --mode hybrid --num-gpus 4 --batch-size 64 \\
        --last-gamma --no-wd --label-smoothing --kvstore dist_odsgd

A job that survives failures: the launcher starts it again (up to --max-restarts times) and
--resume auto goes on from the newest whole checkpoint in --checkpoint-dir (a folder every
host shares); with --use-rec at epoch ends (--save-frequency 1), with the image folder also
every --save-every-steps K steps:

    python -m odsgd.launch -n 4 -s 4 -H hosts --launcher ssh \\
        --max-restarts 3 --checkpoint-dir /shared/ckpt \\
        python examples/train_imagenet.py --use-rec ... --kvstore dist_odsgd \\
        --save-frequency 1 --keep-checkpoints 3 --resume auto

GluonCV's scripts/classification/imagenet/train_imagenet.py command lines run as they are,
with --kvstore added. Data: --use-rec (or any --rec-* flag) reads the RecordIO files;
otherwise --data-dir (GluonCV's default ~/.mxnet/datasets/imagenet) holds the train/ and val/
class folders. docs/reproduce.md has the paper's runs; `--synthetic` runs without data.
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import odsgd  # noqa: E402,F401  (registers dist_odsgd; imports nothing on servers)
import mxnet as mx  # noqa: E402  (on a server or scheduler the job's server loop runs in here)

from odsgd.training import data, networks, options, session  # noqa: E402

IMAGENET_TRAINING_SAMPLES = 1281167
DATA_DIR = "~/.mxnet/datasets/imagenet"
REC_FILES = (("rec_train", "rec/train.rec"), ("rec_train_idx", "rec/train.idx"),
             ("rec_val", "rec/val.rec"), ("rec_val_idx", "rec/val.idx"))


def build_parser():
    parser = options.build_parser(
        __doc__.splitlines()[0], model="resnet50_v1", batch_size=32, num_epochs=120, lr=0.1,
        lr_mode="step", lr_decay_epoch="30,60,90", wd=1e-4, log_interval=50, optimizer="nag")
    group = parser.add_argument_group("ImageNet data")
    group.add_argument("--use-rec", action="store_true",
                       help="read the RecordIO files (--rec-*), as GluonCV; also implied by "
                       "any --rec-* flag given without --data-dir")
    group.add_argument("--data-dir", default=None,
                       help="image folder with train/ and val/ class folders, read when "
                       "--use-rec is not given (default %s)" % DATA_DIR)
    group.add_argument("--rec-train", default=None, help="default %s/rec/train.rec" % DATA_DIR)
    group.add_argument("--rec-train-idx", default=None,
                       help="index of --rec-train: counts the records and shards them "
                       "exactly (give '' for a .rec without index, with "
                       "--num-training-samples); default %s/rec/train.idx" % DATA_DIR)
    group.add_argument("--rec-val", default=None, help="default %s/rec/val.rec" % DATA_DIR)
    group.add_argument("--rec-val-idx", default=None, help="default %s/rec/val.idx" % DATA_DIR)
    group.add_argument("--input-size", type=int, default=224)
    group.add_argument("--crop-ratio", type=float, default=0.875,
                       help="validation: resize to input-size / crop-ratio, centre crop")
    group.add_argument("--num-classes", type=int, default=1000)
    options.add_imagenet_recipe_flags(parser)
    return parser


def resolve_data_source(args):
    """GluonCV's choice: the RecordIO files with --use-rec, else the image folder --data-dir.
    Here --rec-* flags without --data-dir also mean the RecordIO files (earlier commands of
    this script gave no --use-rec)."""
    rec_given = any(getattr(args, name) is not None for name, _ in REC_FILES)
    args.use_rec = args.use_rec or (rec_given and args.data_dir is None)
    for name, default in REC_FILES:
        value = getattr(args, name)
        value = os.path.join(DATA_DIR, default) if value is None else value
        setattr(args, name, os.path.expanduser(value) if value else "")
    args.data_dir = os.path.expanduser(args.data_dir or DATA_DIR)
    return args


def parse_args(argv=None):
    parser = build_parser()
    args = resolve_data_source(parser.parse_args(argv))
    try:
        options.check_arguments(args)
        options.check_imagenet_recipe(args)
        make_net(args)   # an unknown --model, or flags whose arguments the model refuses
        if args.use_pretrained:
            networks.check_pretrained_cached(args.model)
        if not args.synthetic:
            check_files(args)
    except (ValueError, FileNotFoundError, networks.PretrainedWeightsMissing) as error:
        parser.error(str(error))
    return args


def check_files(args):
    if not args.use_rec:
        for split in ("train", "val"):
            if not os.path.isdir(os.path.join(args.data_dir, split)):
                raise FileNotFoundError(
                    "--data-dir %s has no %s/ folder of class folders (GluonCV's image "
                    "layout); for RecordIO files give --use-rec with --rec-train, "
                    "--rec-train-idx, --rec-val, --rec-val-idx, or use --synthetic"
                    % (args.data_dir, split))
        return
    for flag, path in (("--rec-train", args.rec_train), ("--rec-train-idx", args.rec_train_idx),
                       ("--rec-val", args.rec_val), ("--rec-val-idx", args.rec_val_idx)):
        if path and not os.path.exists(path):
            raise FileNotFoundError("%s %s does not exist (make it with MXNet's "
                                    "tools/im2rec.py, or use --synthetic)" % (flag, path))
    if not args.rec_train_idx and not args.num_training_samples:
        raise ValueError("without --rec-train-idx give --num-training-samples")


def model_kwargs(args):
    return networks.recipe_kwargs(args.model, last_gamma=args.last_gamma,
                                  batch_norm=args.batch_norm, use_se=args.use_se,
                                  use_gn=args.use_gn)


@functools.lru_cache(maxsize=1)
def folder_size(data_dir):
    return len(data.imagenet_folder(data_dir, train=True))


def training_size(args):
    if args.synthetic:
        return args.num_training_samples or IMAGENET_TRAINING_SAMPLES
    if not args.use_rec:
        return folder_size(args.data_dir)
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
    if not args.use_rec:
        return data.imagenet_folder_iterators(args, rank, num_workers, batch_size, with_val)
    return data.imagenet_iterators(args, rank, num_workers, batch_size, with_val)


def make_net(args):
    return networks.model_zoo_net(args.model, args.num_classes, no_wd=args.no_wd,
                                  **model_kwargs(args))


def initializer(args):
    """GluonCV's MSRAPrelu, or its pretrained weights with --use-pretrained."""
    if args.use_pretrained:
        return networks.PretrainedWeights(args.model, args.num_classes, mx.init.MSRAPrelu(),
                                          **model_kwargs(args))
    return mx.init.MSRAPrelu()


TASK = session.Task(
    "imagenet", num_classes=lambda args: args.num_classes,
    training_size=training_size, make_iterators=make_iterators, make_net=make_net,
    initializer=initializer)


def main(argv=None):
    return session.train(TASK, parse_args(argv))


if __name__ == "__main__":
    main()
