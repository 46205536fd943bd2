"""Cluster job of tests/test_long_run.py: the paths a long run takes around a checkpoint.

A small MLP (64 -> 90 -> 10, 6,760 parameters) trained with gluon.Trainer on dist_odsgd, global
SGD with momentum 0.9, wd 1e-4 and lr_mult 0.5 on the first bias, on data that depends only on
the rank and the step. What the job does around its checkpoint (--save-at, --prefix):

  --eval-before-save      an evaluation (net(x) outside autograd.record()) right before the save
  --ema-write             an EMA-style evaluation: W shown, then every parameter written in
                          place (p.data()[:] = value) while W is shown, then training goes on
  --resume-from P         load_checkpoint(P) first (then train from its step)
  --save-again P2         after --resume-from, save at once to P2 (no step between) and stop

It writes each worker's own weights w^i and the global weights W (after the last step) to
OUT/rank<r>.npz: keys 'w:<name>' and 'W:<name>'.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402

import mlp_job  # noqa: E402

mlp = mlp_job.MLP(in_units=64, hidden=90, classes=10, batch_size=16, rank_stride=1000)


def parse_args():
    p = mlp_job.arguments(steps=20)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--prefix")
    p.add_argument("--eval-before-save", action="store_true")
    p.add_argument("--ema-write", type=int, default=0,
                   help="the step after which an EMA-style evaluation writes the parameters")
    p.add_argument("--resume-from")
    p.add_argument("--save-again")
    p.add_argument("--optimizer", default="sgd")
    return p.parse_args()


def ema_write(net, step):
    """An EMA evaluation as users write it: evaluate (W shown), then write every parameter in
    place with a value of the user's own while W is shown."""
    net(mlp.batch(0, 999)[0])
    for param in net.collect_params().values():
        param.data()[:] = param.data() * 0.5 + 0.01 * (step + 1)


def main():
    args = parse_args()
    kv = odsgd.DistODSGD()
    net = mlp.network(seed=7, first_bias_lr_mult=0.5)
    trainer = mx.gluon.Trainer(net.collect_params(), args.optimizer,
                               {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                               kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    start = 0
    if args.resume_from:
        odsgd.load_checkpoint(trainer, args.resume_from)
        start = kv.global_step
        if args.save_again:
            odsgd.save_checkpoint(trainer, args.save_again)
            return
    for step in range(start, args.steps):
        data, label = mlp.batch(kv.rank, step)
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(mlp.batch_size)
        if args.ema_write and step + 1 == args.ema_write:
            ema_write(net, step)
        if args.save_at and step + 1 == args.save_at:
            if args.eval_before_save:
                net(mlp.batch(kv.rank, 500)[0]).wait_to_read()
            odsgd.save_checkpoint(trainer, args.prefix)
    mx.nd.waitall()
    mlp_job.write_weights(args.out, kv.rank, net, lambda: odsgd.load_global_weights(trainer))


if __name__ == "__main__":
    main()
