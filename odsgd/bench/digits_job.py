"""Cluster job: trains an MLP (64-128-64-10) on scikit-learn's bundled digits with one kvstore
mode and writes rank 0's results (test accuracy per epoch, samples/s) as JSON.

Started through odsgd.launch by odsgd.bench.compare (make demo) and the convergence study:

    python -m odsgd.launch -n 2 -s 1 --launcher local \
        python -m odsgd.bench.digits_job --kvstore dist_odsgd --json out.json
"""
import argparse
import json
import logging
import time

import odsgd  # registers dist_odsgd; on servers it loads only the server side
import mxnet as mx
import numpy as np

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
    p.add_argument("--hidden", default="128,64")
    p.add_argument("--json", help="rank 0 writes its results here")
    p.add_argument("--log-interval", type=int, default=1, help="epochs between log lines")
    return p.parse_args(argv)


def load_digits(seed):
    """(X_train, y_train, X_test, y_test): scikit-learn's 1797 8x8 digits, scaled to [0, 1],
    split 80/20 with a fixed permutation (the same on every worker)."""
    from sklearn.datasets import load_digits as sklearn_digits
    data = sklearn_digits()
    X = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.float32)
    order = np.random.RandomState(1234).permutation(len(X))
    X, y = X[order], y[order]
    cut = int(0.8 * len(X))
    return X[:cut], y[:cut], X[cut:], y[cut:]


def shard(X, y, rank, num_workers, batch_size):
    """This worker's part of the training set, cut so that every worker has the same number
    of full batches (unequal step counts would leave dist_sync waiting forever)."""
    per_worker = len(X) // num_workers // batch_size * batch_size
    start = rank * per_worker
    return X[start:start + per_worker], y[start:start + per_worker]


def build_net(hidden, seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    for units in hidden:
        net.add(mx.gluon.nn.Dense(units, activation="relu"))
    net.add(mx.gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def accuracy(net, X, y):
    pred = net(mx.nd.array(X)).argmax(axis=1).asnumpy()
    return float((pred == y).mean())


def evaluate_global(net, trainer, kv, args, X, y):
    """Test accuracy of the global weights (the servers'), which is what a user saves."""
    if args.kvstore == "dist_odsgd":
        odsgd.load_global_weights(trainer)
    elif args.kvstore.startswith("dist"):
        for i, param in enumerate(trainer._params):
            kv.pull(i, out=param.list_data())
    return accuracy(net, X, y)


def train(args):
    kv = mx.kv.create(args.kvstore)
    rank, workers = kv.rank, kv.num_workers
    X_train, y_train, X_test, y_test = load_digits(args.seed)
    X, y = shard(X_train, y_train, rank, workers, args.batch_size)
    net = build_net([int(h) for h in args.hidden.split(",")], args.seed)
    net(mx.nd.zeros((1, X.shape[1])))
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
        acc = evaluate_global(net, trainer, kv, args, X_test, y_test)
        history.append({"epoch": epoch + 1, "test_accuracy": acc, "train_loss": total_loss,
                        "wall_time": time.time() - start})
        if rank == 0 and (epoch + 1) % args.log_interval == 0:
            LOG.info("[%s] epoch %d/%d  loss %.4f  test accuracy %.4f  (%.1f s)",
                     args.kvstore, epoch + 1, args.num_epochs, total_loss, acc,
                     time.time() - start)
    samples = steps * args.batch_size * workers
    return {"mode": args.kvstore, "seed": args.seed, "workers": workers,
            "batch_size": args.batch_size, "epochs": args.num_epochs, "steps": steps,
            "final_test_accuracy": history[-1]["test_accuracy"], "history": history,
            "train_time": train_time, "samples_per_sec": samples / train_time,
            "store": (kv.config.as_dict() if args.kvstore == "dist_odsgd" else None)}, rank


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result, rank = train(args)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
