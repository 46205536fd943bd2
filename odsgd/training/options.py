"""Command-line flags shared by the training scripts: GluonCV's names for what GluonCV's
train_imagenet.py has, and the store's own flags (docs/reproduce.md lists them all).

Each script calls `build_parser(description, **defaults)`, adds its data flags, and checks the
result with `check_arguments`.
"""
import argparse
import os

KVSTORES = ("local", "device", "dist_sync", "dist_async", "dist_odsgd")


def build_parser(description, **defaults):
    """The shared flags, with the script's own defaults (e.g. model='resnet50_v1')."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_model_flags(parser.add_argument_group("model and optimization"))
    _add_store_flags(parser.add_argument_group("kvstore and OD-SGD"))
    _add_run_flags(parser.add_argument_group("run, logging and checkpoints"))
    parser.set_defaults(**defaults)
    return parser


def _add_model_flags(group):
    group.add_argument("--model", help="network name (GluonCV model zoo or the script's own)")
    group.add_argument("--mode", choices=("imperative", "symbolic"), default="imperative",
                       help="imperative: gluon.Trainer loop; symbolic: Module.fit, as the "
                       "paper's authors trained")
    group.add_argument("--batch-size", type=int, default=32,
                       help="samples per device (per worker when --num-gpus 0)")
    group.add_argument("--num-epochs", type=int, default=3)
    group.add_argument("--lr", type=float, default=0.1,
                       help="global learning rate, for the mean gradient of one update "
                       "(N x batch samples for dist_sync and dist_odsgd, as MXNet's Module)")
    group.add_argument("--lr-mode", default="step",
                       help="step, cosine, poly, linear or constant (after the warm-up)")
    group.add_argument("--lr-decay", type=float, default=0.1,
                       help="factor of each step decay (global and local schedules)")
    group.add_argument("--lr-decay-epoch", default="40,60",
                       help="epochs of the step decays, comma separated")
    group.add_argument("--warmup-lr", type=float, default=0.0,
                       help="learning rate at the start of the warm-up epochs")
    group.add_argument("--warmup-epochs", type=int, default=0,
                       help="epochs of linear learning-rate warm-up")
    group.add_argument("--wd", type=float, default=1e-4, help="weight decay")
    group.add_argument("--momentum", type=float, default=0.9)
    group.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                       help="training precision (float16: multi-precision SGD, imperative)")
    group.add_argument("--seed", type=int, default=0,
                       help="initial weights and data order (every worker draws the same "
                       "initial weights)")


def _add_store_flags(group):
    group.add_argument("--kvstore", choices=KVSTORES, default="dist_odsgd",
                       help="dist_* need `python -m odsgd.launch`")
    group.add_argument("--local-optimizer", default=None,
                       help="dist_odsgd: predict, sgd or an mx.optimizer name "
                       "(unset: ODSGD_LOCAL_OPTIMIZER or the store's default)")
    group.add_argument("--local-lr", type=float, default=None,
                       help="dist_odsgd, local_optimizer sgd: local learning rate (unset: "
                       "derived from the global rate, see docs/env.md)")
    group.add_argument("--local-momentum", type=float, default=None)
    group.add_argument("--local-wd", type=float, default=None)
    group.add_argument("--local-lr-decay-epoch", default="",
                       help="epochs at which the local rate is multiplied by --lr-decay "
                       "(needs --local-lr)")
    group.add_argument("--compensation", type=float, default=None,
                       help="delay-compensation strength lambda (0: off)")
    group.add_argument("--compensation-mode", choices=("constant", "adaptive"), default=None)
    group.add_argument("--warmup-steps", type=int, default=None,
                       help="global steps of plain synchronous SGD before the local updates")


def _add_run_flags(group):
    group.add_argument("--num-gpus", type=int, default=0,
                       help="GPUs per worker, mx.gpu(0..n-1); 0 trains on the CPU")
    group.add_argument("--offset-gpus-by-rank", action="store_true",
                       help="worker r takes mx.gpu(r*n .. r*n+n-1): several workers on one "
                       "machine (--launcher local) without sharing GPUs")
    # GluonCV's name. Not --num-workers: MXNet's launch.py would take that option (and -n,
    # -s, -H, --env, --launcher) out of the training command as its own.
    group.add_argument("--num-data-workers", "-j", dest="num_workers", type=int, default=4,
                       help="threads for data loading and augmentation")
    group.add_argument("--synthetic", action="store_true",
                       help="random data of the real shapes, no files needed")
    group.add_argument("--num-training-samples", type=int, default=None,
                       help="training samples per epoch when they cannot be counted "
                       "(synthetic data, .rec without .idx)")
    group.add_argument("--log-interval", type=int, default=50,
                       help="batches between speed/metric log lines")
    group.add_argument("--save-dir", default="params", help="checkpoints and the log file")
    group.add_argument("--save-frequency", type=int, default=10,
                       help="epochs between checkpoints (the last epoch is always saved; "
                       "0: only the last)")
    group.add_argument("--logging-file", default=None,
                       help="log file (default: SAVE_DIR/train_<task>.log)")
    group.add_argument("--resume-params", default="",
                       help="parameters to start from (a checkpoint of this script)")
    group.add_argument("--resume-states", default="",
                       help="rank 0's states file of the checkpoint (PREFIX-EEEE.states); "
                       "every worker loads its own (local and dist_odsgd stores; MXNet "
                       "cannot save dist_sync's or dist_async's)")
    group.add_argument("--resume-epoch", type=int, default=0,
                       help="epochs already done: training goes on with the next one and "
                       "the schedule continues from there")
    group.add_argument("--json", default=None,
                       help="rank 0 writes the per-epoch results here as JSON")


def check_arguments(args):
    """Raises ValueError naming the flag for combinations that cannot work."""
    if args.batch_size < 1:
        raise ValueError("--batch-size must be >= 1")
    if args.num_epochs <= args.resume_epoch:
        raise ValueError("--num-epochs (%d) must be larger than --resume-epoch (%d)"
                         % (args.num_epochs, args.resume_epoch))
    if args.mode == "symbolic" and args.dtype != "float32":
        raise ValueError("--mode symbolic trains in float32 only; use --mode imperative "
                         "for --dtype %s" % args.dtype)
    if args.kvstore != "dist_odsgd":
        given = [flag for flag, value in
                 (("--local-optimizer", args.local_optimizer), ("--local-lr", args.local_lr),
                  ("--local-momentum", args.local_momentum), ("--local-wd", args.local_wd),
                  ("--compensation", args.compensation),
                  ("--compensation-mode", args.compensation_mode),
                  ("--warmup-steps", args.warmup_steps),
                  ("--local-lr-decay-epoch", args.local_lr_decay_epoch or None))
                 if value is not None]
        if given:
            raise ValueError("%s only apply to --kvstore dist_odsgd (got --kvstore %s)"
                             % (", ".join(given), args.kvstore))
    if args.dtype == "float16" and args.num_gpus < 1:
        raise ValueError("--dtype float16 needs GPUs (--num-gpus N): MXNet's CPU operators "
                         "train in float32")
    if args.kvstore.startswith("dist") and not os.environ.get("DMLC_NUM_WORKER"):
        raise ValueError("--kvstore %s needs a parameter-server job: start the script with "
                         "`python -m odsgd.launch -n WORKERS -s SERVERS --launcher local "
                         "python SCRIPT ...`, or give --kvstore local" % args.kvstore)
    if args.resume_states and not args.resume_params:
        raise ValueError("--resume-states needs --resume-params from the same checkpoint")
    return args
