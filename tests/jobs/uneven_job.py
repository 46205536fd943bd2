"""Cluster job of the unequal-data tests: worker r has a shard of `--batches + r * --extra`
batches of the quadratic problem. With `--rule equal` every epoch makes
odsgd.equal_steps(trainer, len(shard)) steps (the documented rule); with `--rule ignore` each
worker runs through its whole shard, which must end in a clear error, not a hang; `--rule none`
never calls equal_steps (a worker with an empty shard then makes no step at all). Writes the
final global weights to OUT/rank<r>.npz (global step t uses problem.batch(rank, t), as the
NumPy simulation of the core tests does)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import quadratic_problem as problem  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=3, help="batches of worker 0's shard")
    p.add_argument("--extra", type=int, default=2, help="more batches per rank")
    p.add_argument("--rule", choices=["equal", "ignore", "none"], default="equal")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup-steps", type=int, default=2)
    return p.parse_args(argv)


def main():
    args = parse_args()
    kv = odsgd.DistODSGD(local_optimizer="predict", warmup_steps=args.warmup_steps)
    net = problem.gluon_net()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": args.lr, "momentum": args.momentum}, kvstore=kv)
    shard = args.batches + kv.rank * args.extra
    step = 0
    for epoch in range(args.epochs):
        steps = odsgd.equal_steps(trainer, shard) if args.rule != "none" else shard
        if args.rule == "ignore" and epoch == 0:
            steps = shard
        print("epoch %d: %d of %d local batches" % (epoch, steps, shard), flush=True)
        for _ in range(steps):
            # reading the loss blocks on the previous pull, as a logging training loop does
            problem.gluon_step(net, trainer, kv.rank, step).asscalar()
            step += 1
    if step == 0:
        print("worker %d made no step" % kv.rank, flush=True)
        return
    odsgd.load_global_weights(trainer)
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), steps=step,
             global_weight=net.weight.data().asnumpy(), global_bias=net.bias.data().asnumpy())


if __name__ == "__main__":
    main()
