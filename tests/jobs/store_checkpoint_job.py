"""Job of tests/test_store_checkpoints.py: a gluon.Trainer on MXNet's own stores (dist_sync,
dist_async, or local, run without a launcher) saved and resumed with odsgd.save_checkpoint /
odsgd.resume_or_start, as on dist_odsgd.

An MLP 30 -> 40 -> 6, global SGD with momentum 0.9, wd 1e-4 and a step schedule, data that
depends only on the rank and the step. --dir D: resume from the newest whole checkpoint in D
(if any), save one every --save-every steps. --plain: no resume_or_start (the servers run MXNet's
own updater), to hold the checkpointed run to it. Writes each worker's weights and the servers'
W after the last step to OUT/rank<r>.npz ('w:<name>', 'W:<name>')."""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402
from odsgd.common import checkpoint_index  # noqa: E402

IN, HIDDEN, CLASSES, BATCH = 30, 40, 6, 8


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--kvstore", default="dist_sync")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--dir")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--plain", action="store_true")
    return p.parse_args()


def batch(rank, step):
    rng = np.random.RandomState(100 * rank + step)
    return (mx.nd.array(rng.randn(BATCH, IN).astype(np.float32)),
            mx.nd.array(rng.randint(0, CLASSES, BATCH).astype(np.float32)))


def main():
    args = parse_args()
    net = mx.gluon.nn.Sequential()
    net.add(mx.gluon.nn.Dense(HIDDEN, in_units=IN, activation="relu"),
            mx.gluon.nn.Dense(CLASSES, in_units=HIDDEN))
    mx.random.seed(11)
    net.initialize(mx.init.Xavier())
    schedule = mx.lr_scheduler.FactorScheduler(step=5, factor=0.5, base_lr=0.1)
    kv = mx.kv.create(args.kvstore) if args.kvstore.startswith("dist") else args.kvstore
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4,
                                "lr_scheduler": schedule}, kvstore=kv)
    rank = kv.rank if not isinstance(kv, str) else 0
    start = 0 if args.plain else odsgd.resume_or_start(trainer, args.dir)
    print("rank %d starts at step %d" % (rank, start), flush=True)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(start, args.steps):
        data, label = batch(rank, step)
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(BATCH)
        if args.save_every and (step + 1) % args.save_every == 0:
            odsgd.save_checkpoint(trainer, checkpoint_index.step_prefix(args.dir, "job",
                                                                        step + 1))
    mx.nd.waitall()
    own = {"w:" + p.name: p.data().asnumpy() for p in net.collect_params().values()}
    if not isinstance(kv, str):
        kv._barrier()   # every worker's pushes are applied
        for index, param in enumerate(trainer._params):
            pulled = mx.nd.zeros(param.shape)
            kv.pull(index, out=pulled)
            own["W:" + param.name] = pulled.asnumpy()
    np.savez(os.path.join(args.out, "rank%d.npz" % rank), **own)


if __name__ == "__main__":
    main()
