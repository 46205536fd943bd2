"""Job of tests/test_store_checkpoints.py: a gluon.Trainer on MXNet's own stores (dist_sync,
dist_async, or local, run without a launcher) saved and resumed with odsgd.save_checkpoint /
odsgd.resume_or_start, as on dist_odsgd.

An MLP 30 -> 40 -> 6, global SGD with momentum 0.9, wd 1e-4 and a step schedule, data that
depends only on the rank and the step. --dir D: resume from the newest whole checkpoint in D
(if any), save one every --save-every steps. --plain: no resume_or_start (the servers run MXNet's
own updater), to hold the checkpointed run to it. Writes each worker's weights and the servers'
W after the last step to OUT/rank<r>.npz ('w:<name>', 'W:<name>')."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402
from odsgd.common import checkpoint_index  # noqa: E402

import mlp_job  # noqa: E402

mlp = mlp_job.MLP(in_units=30, hidden=40, classes=6, batch_size=8)


def parse_args():
    p = mlp_job.arguments(steps=12)
    p.add_argument("--kvstore", default="dist_sync")
    p.add_argument("--dir")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--plain", action="store_true")
    return p.parse_args()


def main():
    args = parse_args()
    net = mlp.network(seed=11)
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
        data, label = mlp.batch(rank, step)
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(mlp.batch_size)
        if args.save_every and (step + 1) % args.save_every == 0:
            odsgd.save_checkpoint(trainer, checkpoint_index.step_prefix(args.dir, "job",
                                                                        step + 1))
    mx.nd.waitall()
    servers = {}
    if not isinstance(kv, str):
        kv._barrier()   # every worker's pushes are applied
        for index, param in enumerate(trainer._params):
            pulled = mx.nd.zeros(param.shape)
            kv.pull(index, out=pulled)
            servers["W:" + param.name] = pulled.asnumpy()
    mlp_job.write_weights(args.out, rank, net, **servers)


if __name__ == "__main__":
    main()
