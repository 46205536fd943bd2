"""Command-line flags shared by the training scripts: GluonCV's names for what GluonCV's
train_imagenet.py has, and the store's own flags (docs/reproduce.md lists them all); and the
flags of GluonCV's ImageNet recipes (`add_imagenet_recipe_flags`: --last-gamma, --no-wd,
--label-smoothing, --mixup, ...), with the same meanings.

Each script calls `build_parser(description, **defaults)`, adds its data flags, and checks the
result with `check_arguments` (which also turns --lr-decay-period into --lr-decay-epoch).
"""
import argparse
import os

from ..cluster import restarts

KVSTORES = ("local", "device", "dist_sync", "dist_async", "dist_odsgd")
#: --save-dir when neither the flag nor the launcher's ODSGD_CHECKPOINT_DIR gives one
DEFAULT_SAVE_DIR = "params"
MODES = ("imperative", "symbolic")


def training_mode(text):
    """--mode: GluonCV's 'hybrid' (gluon.Trainer on the hybridized network) is what
    'imperative' runs here."""
    return "imperative" if text == "hybrid" else text


def float_list(text):
    """'123.68,116.779,103.939' -> [123.68, 116.779, 103.939] (GluonCV's --rgb-mean format)."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated numbers, got %r"
                                         % text) from None


#: global optimizers of the training scripts (both predicted by local_optimizer='predict')
GLOBAL_OPTIMIZERS = ("sgd", "nag")


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
    group.add_argument("--mode", type=training_mode, choices=MODES, default="imperative",
                       help="imperative (or GluonCV's name hybrid): gluon.Trainer loop on the "
                       "hybridized network; symbolic: Module.fit, as the paper's authors "
                       "trained")
    group.add_argument("--batch-size", type=int, default=32,
                       help="samples per device (per worker when --num-gpus 0)")
    group.add_argument("--num-epochs", type=int, default=3)
    group.add_argument("--optimizer", choices=GLOBAL_OPTIMIZERS, default="sgd",
                       help="the global optimizer: sgd, or nag (Nesterov momentum, which "
                       "GluonCV's classification recipes train with); local_optimizer "
                       "'predict' predicts either")
    group.add_argument("--lr", type=float, default=0.1,
                       help="global learning rate, for the mean gradient of one update "
                       "(N x batch samples for dist_sync and dist_odsgd, as MXNet's Module)")
    group.add_argument("--lr-mode", default="step",
                       help="step, cosine, poly, linear or constant (after the warm-up)")
    group.add_argument("--lr-decay", type=float, default=0.1,
                       help="factor of each step decay (global and local schedules)")
    group.add_argument("--lr-decay-epoch", default="40,60",
                       help="epochs of the step decays, comma separated")
    group.add_argument("--lr-decay-period", type=int, default=0,
                       help="GluonCV's periodic step decay: at epochs P, 2P, ... below "
                       "--num-epochs (replaces --lr-decay-epoch); 0: off")
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
    group.add_argument("--save-dir", default=None,
                       help="checkpoints and the log file (default: $ODSGD_CHECKPOINT_DIR, "
                       "which `python -m odsgd.launch --checkpoint-dir DIR` sets, else %s)"
                       % DEFAULT_SAVE_DIR)
    _add_checkpoint_flags(group)
    group.add_argument("--json", default=None,
                       help="rank 0 writes the per-epoch results here as JSON")


def _add_checkpoint_flags(group):
    group.add_argument("--save-frequency", type=int, default=10,
                       help="epochs between epoch saves (the last epoch is always saved; "
                       "0: only the last): PREFIX-EEEE.params, the global weights, and in "
                       "imperative mode a whole checkpoint that --resume auto goes on from")
    group.add_argument("--save-every-steps", type=int, default=0, metavar="K",
                       help="also save a whole checkpoint every K global steps, mid-epoch "
                       "too (imperative mode; not with --use-rec, whose ImageRecordIter "
                       "cannot start mid-epoch, nor --mode symbolic, whose Module.fit "
                       "saves at epoch ends only); 0: epoch saves only")
    group.add_argument("--resume", choices=("auto",), default=None,
                       help="auto: resume from the newest whole checkpoint in --save-dir, "
                       "else start fresh (logged). Imperative mode: the run goes on batch for "
                       "batch as the interrupted one would have, from the checkpoint's step, "
                       "bit for bit with dist_odsgd, dist_sync and local stores; dist_async "
                       "resumes its weights, states and step, but its workers' pushes "
                       "interleave by timing, so it never replays the interrupted run. "
                       "--use-rec and --mode symbolic resume at epoch boundaries (symbolic: "
                       "from the epoch saves, each worker from the global weights)")
    group.add_argument("--keep-checkpoints", type=int, default=0, metavar="N",
                       help="keep the newest N whole checkpoints of this run, removing older "
                       "ones after each save (rank 0); 0: keep all. PREFIX-EEEE.params stay")
    group.add_argument("--stop-after-steps", type=int, default=0, metavar="N",
                       help="for tests and drills: stop after global step N (after the save "
                       "due there, if any; exit status 0) as if the job had failed there, so "
                       "that --resume auto can take over; a run resumed past N goes on; 0: "
                       "train every epoch")
    group.add_argument("--fail-after-steps", type=int, default=0, metavar="N",
                       help="a drill of a failure: in the job's first attempt "
                       "(ODSGD_RESTART_COUNT unset or 0), worker 0 kills itself (SIGKILL) "
                       "after global step N, after the save due there, if any; "
                       "`python -m odsgd.launch --max-restarts 1 --checkpoint-dir DIR` then "
                       "starts the job again, and --resume auto goes on; 0: off")
    group.add_argument("--logging-file", default=None,
                       help="log file (default: SAVE_DIR/train_<task>.log)")
    group.add_argument("--resume-params", default="",
                       help="parameters to start from (a checkpoint of this script)")
    group.add_argument("--resume-states", default="",
                       help="rank 0's states file: PREFIX-EEEE.states of a symbolic epoch "
                       "save, or a dist_odsgd whole checkpoint's "
                       "PREFIX-stepNNNNNNNNN-worker0.states; every worker loads its own "
                       "(local and dist_odsgd stores; MXNet cannot save dist_sync's or "
                       "dist_async's: --resume auto resumes those)")
    group.add_argument("--resume-epoch", type=int, default=0,
                       help="epochs already done: training goes on with the next one and "
                       "the schedule continues from there")


def check_arguments(args):
    """Raises ValueError naming the flag for combinations that cannot work; with
    --lr-decay-period P sets --lr-decay-epoch to P, 2P, ... below --num-epochs, as GluonCV."""
    if args.batch_size < 1:
        raise ValueError("--batch-size must be >= 1")
    if args.lr_decay_period < 0:
        raise ValueError("--lr-decay-period must be >= 0 (0: use --lr-decay-epoch)")
    if args.lr_decay_period > 0:
        args.lr_decay_epoch = ",".join(
            str(epoch) for epoch in range(args.lr_decay_period, args.num_epochs,
                                          args.lr_decay_period))
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
    check_checkpoint_flags(args)
    resolve_save_dir(args)
    return args


def resolve_save_dir(args, environ=None):
    """--save-dir, else the launcher's ODSGD_CHECKPOINT_DIR (python -m odsgd.launch
    --checkpoint-dir), else DEFAULT_SAVE_DIR."""
    environ = os.environ if environ is None else environ
    args.save_dir = args.save_dir or environ.get(restarts.CHECKPOINT_DIR_VARIABLE) or \
        DEFAULT_SAVE_DIR
    return args


def check_checkpoint_flags(args):
    """ValueError naming the flag for checkpoint flags that cannot work together."""
    for flag, value in (("--save-every-steps", args.save_every_steps),
                        ("--keep-checkpoints", args.keep_checkpoints),
                        ("--stop-after-steps", args.stop_after_steps),
                        ("--fail-after-steps", args.fail_after_steps)):
        if value < 0:
            raise ValueError("%s must be >= 0 (0: off), got %d" % (flag, value))
    mid_epoch = [flag for flag, value in (("--save-every-steps", args.save_every_steps),
                                          ("--stop-after-steps", args.stop_after_steps),
                                          ("--fail-after-steps", args.fail_after_steps))
                 if value]
    if mid_epoch and args.mode == "symbolic":
        raise ValueError("%s needs --mode imperative (or hybrid): Module.fit (--mode "
                         "symbolic) gives no point between its steps to save or stop at, so "
                         "it saves and resumes at epoch ends only (--save-frequency)"
                         % " and ".join(mid_epoch))
    if args.save_every_steps and getattr(args, "use_rec", False):
        raise ValueError("--save-every-steps cannot be used with --use-rec: MXNet's "
                         "ImageRecordIter cannot start mid-epoch, so a mid-epoch checkpoint "
                         "could not be resumed; save at epoch ends (--save-frequency) or "
                         "read the image folder (--data-dir)")
    legacy = [flag for flag, value in (("--resume-params", args.resume_params),
                                       ("--resume-states", args.resume_states),
                                       ("--resume-epoch", args.resume_epoch)) if value]
    if args.resume and legacy:
        raise ValueError("--resume %s finds its checkpoint itself; drop %s (or --resume)"
                         % (args.resume, ", ".join(legacy)))


# -- GluonCV's ImageNet recipe flags (examples/train_imagenet.py) ---------------------------
#: GluonCV's knowledge-distillation flags (dest, flag), which this project cannot run
DISTILLATION_FLAGS = (("teacher", "--teacher"), ("temperature", "--temperature"),
                      ("hard_weight", "--hard-weight"))


def add_imagenet_recipe_flags(parser):
    """GluonCV train_imagenet.py's recipe flags, with its names and defaults."""
    group = parser.add_argument_group("GluonCV ImageNet recipe")
    group.add_argument("--last-gamma", action="store_true",
                       help="the last BatchNorm of each residual block starts with gamma 0 "
                       "(model argument last_gamma=True)")
    group.add_argument("--no-wd", action="store_true",
                       help="no weight decay (wd_mult 0) on biases and BatchNorm's beta and "
                       "gamma (parameters matching '.*beta|.*gamma|.*bias')")
    group.add_argument("--label-smoothing", action="store_true",
                       help="targets 1 - 0.1 + 0.1/classes for the label, 0.1/classes for "
                       "the others")
    group.add_argument("--mixup", action="store_true",
                       help="train on lam*x + (1-lam)*x[::-1] with targets mixed alike, lam "
                       "~ Beta(alpha, alpha) per batch")
    group.add_argument("--mixup-alpha", type=float, default=0.2,
                       help="alpha of mixup's Beta distribution")
    group.add_argument("--mixup-off-epoch", type=int, default=0,
                       help="last epochs trained without mixup (lam = 1)")
    group.add_argument("--use-pretrained", action="store_true",
                       help="start from GluonCV's pretrained weights; they must be in the "
                       "local model-zoo cache (~/.mxnet/models): nothing is downloaded")
    group.add_argument("--batch-norm", action="store_true",
                       help="VGG models with BatchNorm (model argument batch_norm)")
    group.add_argument("--use_se", "--use-se", dest="use_se", action="store_true",
                       help="ResNeXt models with squeeze-and-excitation (model argument use_se)")
    group.add_argument("--use-gn", action="store_true",
                       help="GroupNorm instead of BatchNorm (model argument "
                       "norm_layer=gluoncv.nn.GroupNorm)")
    group.add_argument("--rgb-mean", type=float_list, default=None,
                       help="per-channel R,G,B mean, 0..255 scale (default: GluonCV's, "
                       "123.68,116.779,103.939 for .rec files, 255 x 0.485,0.456,0.406 for "
                       "the image folder)")
    group.add_argument("--rgb-std", type=float_list, default=None,
                       help="per-channel R,G,B std, 0..255 scale (default: GluonCV's, "
                       "58.393,57.12,57.375 for .rec files, 255 x 0.229,0.224,0.225 for the "
                       "image folder)")
    group.add_argument("--data-backend", choices=("mxnet", "dali-gpu", "dali-cpu"),
                       default="mxnet", help="mxnet only (GluonCV's DALI back ends are not "
                       "supported)")
    refused = parser.add_argument_group("GluonCV flags that are refused")
    for dest, flag in DISTILLATION_FLAGS:
        refused.add_argument(flag, dest=dest, default=None,
                             help="knowledge distillation: not supported")


def check_imagenet_recipe(args):
    """Raises ValueError naming the flag for recipe flags that cannot work (see
    add_imagenet_recipe_flags)."""
    given = [flag for dest, flag in DISTILLATION_FLAGS if getattr(args, dest) is not None]
    if given:
        raise ValueError("%s: knowledge distillation (GluonCV's --teacher, --temperature, "
                         "--hard-weight) is not supported here; train without these flags"
                         % ", ".join(given))
    if args.data_backend != "mxnet":
        raise ValueError("--data-backend %s: GluonCV's DALI back ends are not supported here; "
                         "use --data-backend mxnet (the default)" % args.data_backend)
    if args.mode == "symbolic":
        given = [flag for flag, value in (("--label-smoothing", args.label_smoothing),
                                          ("--mixup", args.mixup),
                                          ("--use-pretrained", args.use_pretrained)) if value]
        if given:
            raise ValueError("%s: GluonCV's training loop only; use --mode hybrid (or "
                             "imperative) instead of --mode symbolic" % ", ".join(given))
    if args.mixup and args.mixup_alpha <= 0:
        raise ValueError("--mixup-alpha must be > 0 (the Beta distribution's parameter)")
    if args.mixup_off_epoch < 0:
        raise ValueError("--mixup-off-epoch must be >= 0")
    for flag, values in (("--rgb-mean", args.rgb_mean), ("--rgb-std", args.rgb_std)):
        if values is not None and len(values) != 3:
            raise ValueError("%s takes 3 comma-separated numbers (R,G,B), got %d"
                             % (flag, len(values)))
    if args.rgb_std is not None and min(args.rgb_std) <= 0:
        raise ValueError("--rgb-std values must be > 0")
    if args.use_pretrained and args.num_classes != 1000:
        raise ValueError("--use-pretrained loads GluonCV's ImageNet weights, with 1000 "
                         "classes: drop --num-classes %d or --use-pretrained"
                         % args.num_classes)
    return args
