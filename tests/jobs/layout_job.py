"""Cluster job of tests/test_layouts.py: an MLP (500 -> 600 -> 10, 307,610 parameters: its
first weight is cut into parts at the default ODSGD_PART_ELEMENTS) trained with gluon.Trainer
on dist_odsgd, global SGD with momentum, weight decay, lr_mult / wd_mult and a step schedule,
on data that depends only on the rank and the step.

It saves a checkpoint after --save-at steps (odsgd.save_checkpoint) and stops, or resumes from
one (odsgd.load_checkpoint) and trains from there to --steps; either way it writes the newest
global weights (odsgd.load_global_weights) to OUT/rank<r>.npz. The key layout comes from the
environment of the job (ODSGD_PART_ELEMENTS, DMLC_NUM_SERVER, ...), so a test can save under
one layout and resume under another.

--part-elements-by-task gives each process its own ODSGD_PART_ELEMENTS (4 + its DMLC_TASK_ID)
before the store is made: every worker must then refuse the store with a ValueError, which
the job writes to OUT/error<task id>.txt."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402

import mlp_job  # noqa: E402

mlp = mlp_job.MLP(in_units=500, hidden=600, classes=10, batch_size=8)


def parse_args():
    p = mlp_job.arguments(steps=60)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--prefix", help="checkpoint prefix (saved with --save-at, else loaded)")
    p.add_argument("--resume-at", type=int, default=0)
    p.add_argument("--begin-num-update", type=int, default=0)
    p.add_argument("--part-elements-by-task", action="store_true")
    return p.parse_args()


def make_store(args):
    if args.part_elements_by_task:
        os.environ["ODSGD_PART_ELEMENTS"] = str(4 + int(os.environ["DMLC_TASK_ID"]))
        try:
            return odsgd.DistODSGD()
        except ValueError as error:
            path = os.path.join(args.out, "error%s.txt" % os.environ["DMLC_TASK_ID"])
            with open(path, "w") as f:
                f.write(str(error))
            return None
    return odsgd.DistODSGD()


def main():
    args = parse_args()
    kv = make_store(args)
    if kv is None:
        return
    net = mlp.network(seed=3, hybrid=True, first_bias_lr_mult=0.5, no_bias_decay=True)
    schedule = mx.lr_scheduler.MultiFactorScheduler(step=[40], factor=0.1, base_lr=0.05)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3,
                                "lr_scheduler": schedule,
                                "begin_num_update": args.begin_num_update}, kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    if args.resume_at:
        odsgd.load_checkpoint(trainer, args.prefix)
    last = args.save_at or args.steps
    for step in range(args.resume_at, last):
        data, label = mlp.batch(kv.rank, step)
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(mlp.batch_size)
    if args.save_at:
        odsgd.save_checkpoint(trainer, args.prefix)
    odsgd.load_global_weights(trainer)
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), **mlp_job.named_weights(net))


if __name__ == "__main__":
    main()
