"""Job of the fault sweep (`python -m odsgd.bench faults`, odsgd/bench/faults.py): a small
gluon model on dist_odsgd that saves a checkpoint to a new prefix every few steps and stops at
a chosen point of a chosen step, saying so, for the sweep to aim a fault there (a save it
aims at by the files that appear).

Lines it prints, each with this process's pid (with the ssh launcher the launcher knows only
its ssh client's):

    rank <r> pid <p>                             once the store is made
    step <t> pid <p> loss <l>                    after step t's trainer.step (t from 1)
    fault-point before-push step <t> pid <p>     gradient computed, nothing in flight; pauses
    fault-point in-flight step <t> pid <p>       trainer.step returned, its rounds queued
    rounds of step <t> done <s> s after the mark (then, once they completed)
    saving <prefix> pid <p> / saved <prefix>     around odsgd.save_checkpoint

At the end each worker writes <out>/rank<r>.npz: its own weights w^i (`local/<name>`) and the
global weights W (`global/<name>`). A job that resumes from a checkpoint of step k
(--resume PREFIX --first-step k) makes steps k+1 .. --steps, on the same batches.
"""
import argparse
import os
import time

import odsgd  # registers dist_odsgd; on servers it loads only the server side
import mxnet as mx
import numpy as np

#: the model: INPUTS -> HIDDEN (relu) -> OUTPUTS. The first layer's weight (131072 elements)
#: is cut into parts by a small ODSGD_PART_ELEMENTS; the rest are small and fused.
INPUTS, HIDDEN, OUTPUTS, BATCH = 256, 512, 10, 32
#: where a worker stops for the sweep to aim (the sweep aims at a save by its files)
POINTS = ("none", "before-push", "in-flight")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="the last step")
    p.add_argument("--first-step", type=int, default=0, help="the step the resumed "
                   "checkpoint was saved after (0: a fresh start)")
    p.add_argument("--resume", help="checkpoint prefix to load before the first step")
    p.add_argument("--save-every", type=int, default=0, help="save after every k-th step")
    p.add_argument("--checkpoints", help="folder of the checkpoints (<folder>/step<t>)")
    p.add_argument("--out", required=True, help="folder for rank<r>.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault-point", choices=POINTS, default="none")
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--fault-rank", type=int, default=1, help="the worker that marks the point")
    p.add_argument("--pause", type=float, default=2.0,
                   help="seconds the marking worker waits at before-push (the fault lands)")
    p.add_argument("--step-sleep", type=float, default=0.1, help="seconds after each step")
    p.add_argument("--tag", default="", help="ignored; makes the job's command lines unique")
    return p.parse_args(argv)


def build(seed):
    """The net (the same initial weights on every worker; rank 0's reach the servers), with
    an lr_mult on the cut weight and no weight decay on the output bias."""
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=INPUTS),
            mx.gluon.nn.Dense(OUTPUTS, in_units=HIDDEN))
    net.initialize(mx.init.Xavier())
    net[0].weight.lr_mult = 0.5
    net[1].bias.wd_mult = 0.0
    return net


def batch(seed, rank, step):
    """Worker `rank`'s batch of step `step`: the same in every run of the same seed."""
    teacher = np.random.RandomState(seed).standard_normal((INPUTS, OUTPUTS)) / INPUTS ** 0.5
    x = np.random.RandomState([seed, rank, step]).standard_normal((BATCH, INPUTS))
    return mx.nd.array(x), mx.nd.array(np.tanh(x @ teacher))


def say(text):
    print("%s pid %d" % (text, os.getpid()), flush=True)


def save(trainer, args, step):
    prefix = os.path.join(args.checkpoints, "step%d" % step)
    say("saving %s" % prefix)
    odsgd.save_checkpoint(trainer, prefix)
    print("saved %s" % prefix, flush=True)


def train_step(net, trainer, args, rank, step):
    x, y = batch(args.seed, rank, step)
    with mx.autograd.record():
        loss = ((net(x) - y) ** 2).mean()
    loss.backward()
    aimed = step == args.fault_step and rank == args.fault_rank
    if aimed and args.fault_point == "before-push":
        mx.nd.waitall()   # nothing of this worker in flight: the fault comes before the push
        say("fault-point before-push step %d" % step)
        time.sleep(args.pause)
    trainer.step(BATCH)
    if aimed and args.fault_point == "in-flight":
        say("fault-point in-flight step %d" % step)
        marked = time.time()
        mx.nd.waitall()   # the rounds on the wire complete (unless the fault stops them)
        print("rounds of step %d done %.3f s after the mark" % (step, time.time() - marked),
              flush=True)
    print("step %d pid %d loss %.6f" % (step, os.getpid(), loss.asscalar()), flush=True)


def write_weights(net, trainer, args, rank):
    """rank<r>.npz: this worker's own weights, then the global weights after the last step."""
    mx.nd.waitall()
    params = net.collect_params()
    arrays = {"local/" + name: p.data().asnumpy() for name, p in params.items()}
    odsgd.load_global_weights(trainer)
    arrays.update({"global/" + name: p.data().asnumpy() for name, p in params.items()})
    np.savez(os.path.join(args.out, "rank%d.npz" % rank), **arrays)


def main(argv=None):
    args = parse_args(argv)
    net = build(args.seed)
    kv = odsgd.DistODSGD(warmup_steps=3)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                               kvstore=kv)
    say("rank %d" % kv.rank)
    if args.resume:
        odsgd.load_checkpoint(trainer, args.resume)
    for step in range(args.first_step + 1, args.steps + 1):
        train_step(net, trainer, args, kv.rank, step)
        time.sleep(args.step_sleep)
        if args.save_every and step % args.save_every == 0:
            save(trainer, args, step)
    write_weights(net, trainer, args, kv.rank)


if __name__ == "__main__":
    main()
