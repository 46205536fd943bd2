"""Cluster job: trains an MLP (64-128-64-10, default) or a small CNN (--model cnn) on
scikit-learn's bundled digits with one kvstore mode and writes rank 0's results (test accuracy
per epoch, samples/s) as JSON.

Started through odsgd.launch by `make demo` (examples/demo.py) and the convergence study
(`python -m odsgd.bench convergence`); dist_odsgd takes its settings from the ODSGD_*
environment (docs/env.md):

    python -m odsgd.launch -n 2 -s 1 --launcher local \
        python -m odsgd.bench.digits_job --kvstore dist_odsgd --json out.json
"""
import argparse
import logging
import time

import odsgd  # noqa: F401 - registers dist_odsgd; on servers only the server side
import mxnet as mx  # on a server or scheduler the job's server loop runs in here
import numpy as np

from odsgd.bench.study_job import run_and_write
from odsgd.training import data as training_data
from odsgd.training import store
from odsgd.training.imperative import EvaluationNet
from odsgd.training.session import finish_queued_work_at_exit

LOG = logging.getLogger("odsgd.digits")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvstore", default="dist_odsgd",
                   help="dist_sync, dist_async, dist_odsgd or local")
    p.add_argument("--num-epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                   help="mlp: Dense layers of --hidden; cnn: conv 3x3 x16, conv 3x3 x32, "
                   "max-pool, Dense 64")
    p.add_argument("--hidden", default="128,64", help="mlp: units of the hidden layers")
    p.add_argument("--json", help="rank 0 writes its results here")
    p.add_argument("--log-interval", type=int, default=1, help="epochs between log lines")
    return p.parse_args(argv)


def load_digits(seed=None):
    """(X_train, y_train, X_test, y_test): scikit-learn's 1797 8x8 digits, X (N, 1, 8, 8) in
    [0, 1], split 80/20 with a fixed permutation (the same on every worker, whatever `seed`;
    the training scripts' --digits uses the same split)."""
    (X_train, y_train), (X_test, y_test) = training_data.load_digits()
    return X_train, y_train.astype(np.float32), X_test, y_test.astype(np.float32)


def shard(X, y, rank, num_workers, batch_size):
    """This worker's part of the training set, cut so that every worker has the same number
    of full batches (unequal step counts would leave dist_sync waiting forever)."""
    per_worker = len(X) // num_workers // batch_size * batch_size
    start = rank * per_worker
    return X[start:start + per_worker], y[start:start + per_worker]


def make_net(model, hidden):
    """The uninitialised network (10 outputs)."""
    net = mx.gluon.nn.HybridSequential()
    if model == "cnn":
        net.add(mx.gluon.nn.Conv2D(16, 3, padding=1, activation="relu"),
                mx.gluon.nn.Conv2D(32, 3, padding=1, activation="relu"),
                mx.gluon.nn.MaxPool2D(2), mx.gluon.nn.Flatten(),
                mx.gluon.nn.Dense(64, activation="relu"))
    else:
        for units in hidden:
            net.add(mx.gluon.nn.Dense(units, activation="relu"))
    net.add(mx.gluon.nn.Dense(10))
    return net


def build_net(model, hidden, seed):
    """The network with `seed`'s initial weights (shapes deferred to the first batch: an
    inference-mode forward here would reorder convolution weights for MKL-DNN, see
    odsgd.training.networks)."""
    mx.random.seed(seed)
    net = make_net(model, hidden)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def accuracy(predict, X, y):
    pred = predict(mx.nd.array(X)).argmax(axis=1).asnumpy()
    return float((pred == y).mean())


def evaluate_global(net, trainer, kv, X, y, evaluation):
    """Test accuracy of the global weights (the servers'), which is what a user saves,
    evaluated on a copy of the network (`evaluation`, see odsgd.training.imperative)."""
    store.load_global_weights(trainer, kv)
    evaluation.refresh(net)
    return accuracy(evaluation.net, X, y)


def train(args):
    finish_queued_work_at_exit()   # before the store registers its own exit check
    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    X_train, y_train, X_test, y_test = load_digits(args.seed)
    X, y = shard(X_train, y_train, rank, workers, args.batch_size)
    hidden = [int(h) for h in args.hidden.split(",") if h.strip()]
    net = build_net(args.model, hidden, args.seed)
    evaluation = EvaluationNet(lambda: make_net(args.model, hidden), [mx.cpu()], "float32")
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": args.lr, "momentum": args.momentum,
                                "wd": args.wd}, kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(args.seed * 100 + rank)
    history, train_time, steps = [], 0.0, 0
    start = time.time()
    for epoch in range(args.num_epochs):
        order = rng.permutation(len(X))
        tic = time.time()
        total_loss = 0.0
        for b in range(len(X) // args.batch_size):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            data, label = mx.nd.array(X[idx]), mx.nd.array(y[idx])
            with mx.autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch_size)
            total_loss += loss.mean()
            steps += 1
        total_loss = float(total_loss.asscalar()) / max(1, len(X) // args.batch_size)
        train_time += time.time() - tic
        acc = evaluate_global(net, trainer, kv, X_test, y_test, evaluation)
        history.append({"epoch": epoch + 1, "test_accuracy": acc, "train_loss": total_loss,
                        "wall_time": time.time() - start})
        if rank == 0 and (epoch + 1) % args.log_interval == 0:
            LOG.info("[%s] epoch %d/%d  loss %.4f  test accuracy %.4f  (%.1f s)",
                     args.kvstore, epoch + 1, args.num_epochs, total_loss, acc,
                     time.time() - start)
    samples = steps * args.batch_size * workers
    return {"mode": args.kvstore, "model": args.model, "seed": args.seed, "workers": workers,
            "batch_size": args.batch_size, "epochs": args.num_epochs, "steps": steps,
            "final_test_accuracy": history[-1]["test_accuracy"], "history": history,
            "train_time": train_time, "samples_per_sec": samples / train_time,
            "store": (kv.config.as_dict() if args.kvstore == "dist_odsgd" else None)}, rank


def main(argv=None):
    run_and_write(parse_args, train, argv)


if __name__ == "__main__":
    main()
