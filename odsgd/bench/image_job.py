"""Cluster job: trains a LeNet-style CNN on real 28x28 images (Fashion-MNIST or MNIST-5k,
odsgd.training.image_datasets) with one kvstore mode, and writes rank 0's results as JSON:
test accuracy of the global weights on the test set after every evaluation, with the
training time so far (evaluations taken out) and samples/s.

Started through odsgd.launch by `make demo` (examples/demo.py) and
`python -m odsgd.bench time-to-accuracy`:

    python -m odsgd.launch -n 2 -s 1 --launcher local \\
        python -m odsgd.bench.image_job --kvstore dist_odsgd --json out.json
"""
import argparse
import logging
import time

import odsgd  # noqa: F401 - registers dist_odsgd; on servers only the server side
import mxnet as mx  # on a server or scheduler the job's server loop runs in here
import numpy as np

from odsgd.bench.jobs import MOMENTUM_OPTIMIZERS, global_optimizer_params, parse_optimizer_params
from odsgd.bench.study_job import run_and_write
from odsgd.training import image_datasets, schedule, store
from odsgd.training.imperative import EvaluationNet
from odsgd.training.session import finish_queued_work_at_exit

LOG = logging.getLogger("odsgd.image_job")
EVAL_BATCH = 1000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvstore", default="dist_odsgd",
                   help="dist_sync, dist_async, dist_odsgd or local")
    p.add_argument("--dataset", choices=image_datasets.DATASETS, default=None,
                   help="default: fashion-mnist when Debian's dataset-fashion-mnist is "
                   "installed, else mnist-5k")
    p.add_argument("--data-dir", help="a folder with the four original idx files of MNIST or "
                   "Fashion-MNIST (plain or .gz), instead of the packaged data")
    p.add_argument("--train-subset", type=int, default=0,
                   help="train on the first N training images (0: all)")
    p.add_argument("--test-subset", type=int, default=0,
                   help="evaluate on the first N test images (0: the whole test set)")
    p.add_argument("--num-epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-mode", choices=schedule.MODES, default="cosine",
                   help="schedule of the global rate over the run (the servers run it)")
    p.add_argument("--lr-decay", type=float, default=0.1, help="step mode: the factor")
    p.add_argument("--lr-decay-epoch", default="",
                   help="step mode: comma-separated epochs at which the rate is multiplied "
                   "by --lr-decay")
    p.add_argument("--optimizer", default="sgd",
                   help="the global optimizer, any mx.optimizer name: sgd (momentum), nag "
                   "(Nesterov, as GluonCV's recipes), adam, rmsprop, ...")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="of the optimizers that take one (%s)" % ", ".join(MOMENTUM_OPTIMIZERS))
    p.add_argument("--optimizer-params", default="",
                   help="the global optimizer's own arguments, NAME=VALUE,... (e.g. "
                   "beta1=0.9,beta2=0.999)")
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-interval", type=int, default=0,
                   help="global steps between evaluations (0: once per epoch)")
    p.add_argument("--json", help="rank 0 writes its results here")
    p.add_argument("--save-params", help="rank 0 saves the final global weights here "
                   "(gluon .params of make_net())")
    args = p.parse_args(argv)
    try:
        parse_optimizer_params(args.optimizer_params)
    except ValueError as error:
        p.error(str(error))
    if args.optimizer.lower() not in mx.optimizer.Optimizer.opt_registry:
        p.error("--optimizer %r is not an mx.optimizer name (%s)"
                % (args.optimizer, ", ".join(sorted(mx.optimizer.Optimizer.opt_registry))))
    if args.dataset is None:
        args.dataset = image_datasets.default_dataset()
    for name in ("num_epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    try:
        args.lr_decay_epoch = schedule.parse_epochs(args.lr_decay_epoch)
    except ValueError:
        p.error("--lr-decay-epoch takes comma-separated whole epochs, e.g. 2,3")
    if args.lr_decay_epoch and args.lr_mode != "step":
        p.error("--lr-decay-epoch needs --lr-mode step")
    return args


def make_net():
    """MXNet's LeNet for 28x28 inputs (5x5 convolutions of 20 and 50 filters, each followed by
    2x2 max pooling, Dense 500, Dense 10), with ReLU; 431,080 parameters (1.7 MB)."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(20, 5, activation="relu"), mx.gluon.nn.MaxPool2D(2, 2),
            mx.gluon.nn.Conv2D(50, 5, activation="relu"), mx.gluon.nn.MaxPool2D(2, 2),
            mx.gluon.nn.Flatten(), mx.gluon.nn.Dense(500, activation="relu"),
            mx.gluon.nn.Dense(10))
    return net


def build_net(seed):
    """The network with `seed`'s initial weights; shapes stay deferred to the first training
    batch (an inference-mode forward would reorder convolution weights for MKL-DNN, see
    odsgd.training.networks)."""
    mx.random.seed(seed)
    net = make_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def accuracy(predict, X, y):
    """Share of X (float32 NCHW) that `predict` classifies as y, in batches."""
    correct = 0
    for start in range(0, len(X), EVAL_BATCH):
        scores = predict(mx.nd.array(X[start:start + EVAL_BATCH]))
        correct += int((scores.argmax(axis=1).asnumpy() == y[start:start + EVAL_BATCH]).sum())
    return correct / float(len(X))


def load_data(args, rank, workers):
    (X_train, y_train), (X_test, y_test) = image_datasets.load(args.dataset, args.data_dir)
    X_train, y_train = image_datasets.subset(X_train, y_train, args.train_subset)
    X_test, y_test = image_datasets.subset(X_test, y_test, args.test_subset)
    X, y = image_datasets.shard(X_train, y_train, rank, workers, args.batch_size)
    return (image_datasets.to_float(X), y.astype(np.float32), len(X_train),
            image_datasets.to_float(X_test), y_test)


class Clock(object):
    """Training seconds so far, with the evaluations taken out."""

    def __init__(self):
        self.train_seconds, self._since = 0.0, None

    def start(self):
        self._since = time.time()

    def stop(self):
        self.train_seconds += time.time() - self._since


def train(args):
    finish_queued_work_at_exit()   # before the store registers its own exit check
    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    X, y, train_size, X_test, y_test = load_data(args, rank, workers)
    steps_per_epoch = len(X) // args.batch_size
    net = build_net(args.seed)
    evaluation = EvaluationNet(make_net, [mx.cpu()], "float32")
    iters = schedule.iterations_per_epoch(steps_per_epoch, workers, args.kvstore)
    lr_schedule = schedule.build_schedule(args.lr, args.lr_mode, args.num_epochs, iters,
                                          lr_decay=args.lr_decay,
                                          lr_decay_epoch=args.lr_decay_epoch)
    params = global_optimizer_params(args.optimizer, args.lr, args.momentum, args.wd,
                                     args.optimizer_params)
    trainer = mx.gluon.Trainer(net.collect_params(), args.optimizer,
                               dict(params, lr_scheduler=lr_schedule), kvstore=kv)
    step_scale = args.batch_size * (workers if store.is_synchronous(kv) else 1)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(args.seed * 100 + rank)
    interval = args.eval_interval or steps_per_epoch
    distributed = args.kvstore.startswith("dist")
    history, steps, clock = [], 0, Clock()
    total_steps = steps_per_epoch * args.num_epochs

    def evaluate(epoch):
        # Every worker stops here (barriers), so no mode trains on while rank 0 evaluates.
        if distributed:
            kv._barrier()
        clock.stop()
        store.load_global_weights(trainer, kv)   # the servers' weights, what a user saves
        if rank == 0:
            evaluation.refresh(net)
            acc = accuracy(evaluation.net, X_test, y_test)
            history.append({"step": steps, "epoch": round(epoch, 4), "test_accuracy": acc,
                            "train_seconds": clock.train_seconds})
            LOG.info("[%s] step %d/%d (epoch %.2f)  test accuracy %.4f  (%.1f s training)",
                     args.kvstore, steps, total_steps, epoch, acc, clock.train_seconds)
        if distributed:
            kv._barrier()
        clock.start()

    if rank == 0:
        LOG.info("[%s] %s: %d training images (%d per worker, %d steps per epoch), %d test "
                 "images", args.kvstore, args.dataset, train_size, len(X), steps_per_epoch,
                 len(X_test))
    clock.start()
    for epoch in range(args.num_epochs):
        order = rng.permutation(len(X))
        for b in range(steps_per_epoch):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            data, label = mx.nd.array(X[idx]), mx.nd.array(y[idx])
            with mx.autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(step_scale)
            steps += 1
            if steps % interval == 0 or steps == total_steps:
                mx.nd.waitall()
                evaluate(steps / float(steps_per_epoch))
    samples = steps * args.batch_size * workers
    result = {"mode": args.kvstore, "dataset": args.dataset, "model": "lenet",
              "seed": args.seed, "workers": workers, "batch_size": args.batch_size,
              "epochs": args.num_epochs, "train_images": train_size,
              "test_images": len(X_test), "steps": steps, "lr": args.lr,
              "lr_mode": args.lr_mode, "lr_decay_epoch": args.lr_decay_epoch,
              "optimizer": args.optimizer, "momentum": args.momentum, "wd": args.wd,
              "optimizer_params": args.optimizer_params,
              "final_test_accuracy": history[-1]["test_accuracy"] if history else None,
              "history": history, "train_seconds": clock.train_seconds,
              "samples_per_sec": samples / clock.train_seconds,
              "store": (kv.config.as_dict() if args.kvstore == "dist_odsgd" else None)}
    if rank == 0 and args.save_params:
        evaluation.net.save_parameters(args.save_params)
    return result, rank


def main(argv=None):
    run_and_write(parse_args, train, argv)


if __name__ == "__main__":
    main()
