"""Job of the fault sweep (`python -m odsgd.bench faults`, odsgd/bench/faults.py): a small
gluon model on dist_odsgd that resumes itself from the newest whole checkpoint of its folder
(`odsgd.resume_or_start`), saves a whole checkpoint every few steps (`step_prefix` names) and
marks chosen points of chosen attempts (ODSGD_RESTART_COUNT) for the sweep to aim a fault at;
or makes the fault itself there (a hang, a ValueError).

Lines it prints (A: the attempt, ODSGD_RESTART_COUNT; p: this process's pid, as the ssh
launcher knows only its ssh client's):

    rank <r> attempt <A> pid <p>                  once the store is made
    resumed from step <k> attempt <A> pid <p>     after resume_or_start (k = 0: a fresh start)
    step <t> attempt <A> loss <l> pid <p>         after step t's trainer.step (t from 1)
    fault-point <point> attempt <A> [step <t>] pid <p>   at a marked point (see POINTS)
    rounds of step <t> done <s> s after the mark attempt <A>   (in-flight, first-step)
    saving <prefix> attempt <A> pid <p> / saved <prefix> attempt <A>   around save_checkpoint
    finished attempt <A>                          after <out>/rank<r>.npz is written

At the end each worker writes <out>/rank<r>.npz: its own weights w^i (`local/<name>`) and the
global weights W (`global/<name>`). Batches depend only on the seed, the rank and the step, so
a resumed attempt makes the steps after its checkpoint on the same data.
"""
import argparse
import os
import time

import odsgd  # registers dist_odsgd; on servers it loads only the server side
import mxnet as mx
from odsgd.bench.fault_cases import INSIDE_FAULTS, POINTS, RUN_NAME
from odsgd.cluster import restarts
from odsgd.common import checkpoint_index
import numpy as np

#: the model: INPUTS -> HIDDEN (relu) -> OUTPUTS. The first layer's weight (131072 elements)
#: is cut into parts by a small ODSGD_PART_ELEMENTS; the rest are small and fused.
INPUTS, HIDDEN, OUTPUTS, BATCH = 256, 512, 10, 32
# Points a worker marks (--mark POINT:ATTEMPT) or makes an inside fault at (--inject
# KIND:POINT:ATTEMPT, KIND one of fault_cases.INSIDE_FAULTS: the target sleeps forever, or
# raises a ValueError); fault_cases.POINTS:
#   up           the worker's script runs, before its store is made (the worker on
#                --fault-host: the rank is not known yet)
#   load         right before resume_or_start; an injected fault strikes inside the load,
#                after W reached the servers and before the states are loaded
#   before-push  step --fault-step: gradient computed, nothing in flight; pauses --pause s
#   in-flight    step --fault-step: trainer.step returned, its rounds on the wire
#   first-step   the attempt's first step, trainer.step returned, its rounds on the wire
#   save         the save after step --save-step; an injected fault strikes inside it,
#                after the weights file and before the states (the sweep aims an outside
#                fault by the files that appear)


def point_attempt(text):
    """POINT:ATTEMPT, e.g. in-flight:0."""
    point, _, attempt = text.partition(":")
    if point not in POINTS or not attempt.isdigit():
        raise argparse.ArgumentTypeError("give POINT:ATTEMPT, POINT one of %s (got %r)"
                                         % (", ".join(POINTS), text))
    return point, int(attempt)


def injection(text):
    """KIND:POINT:ATTEMPT, e.g. hang:load:1."""
    kind, _, rest = text.partition(":")
    if kind not in INSIDE_FAULTS:
        raise argparse.ArgumentTypeError("give KIND:POINT:ATTEMPT, KIND one of %s (got %r)"
                                         % (", ".join(INSIDE_FAULTS), text))
    return (kind,) + point_attempt(rest)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="the last step")
    p.add_argument("--save-every", type=int, default=0, help="save after every k-th step")
    p.add_argument("--checkpoints", help="folder of the checkpoints, resumed from")
    p.add_argument("--out", required=True, help="folder for rank<r>.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mark", type=point_attempt, action="append", default=[],
                   metavar="POINT:ATTEMPT", help="print the point's line there")
    p.add_argument("--inject", type=injection, default=None, metavar="KIND:POINT:ATTEMPT",
                   help="make fault KIND there (hang or value-error)")
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--save-step", type=int, default=-1)
    p.add_argument("--fault-rank", type=int, default=1, help="the worker that marks a point")
    p.add_argument("--fault-host", default="", help="the host whose worker marks `up`")
    p.add_argument("--pause", type=float, default=2.0,
                   help="seconds the marking worker waits at before-push (the fault lands)")
    p.add_argument("--step-sleep", type=float, default=0.1, help="seconds after each step")
    p.add_argument("--tag", default="", help="ignored; makes the job's command lines unique")
    return p.parse_args(argv)


class Marks(object):
    """The points this worker marks in this attempt, and the fault it makes itself."""

    def __init__(self, args, attempt):
        self.args, self.attempt = args, attempt
        self.rank = None   # known once the store is made
        self.points = {point for point, at in args.mark if at == attempt}
        self.injected = None
        if args.inject is not None and args.inject[2] == attempt:
            self.injected = args.inject[:2]   # (kind, point)
            self.points.add(args.inject[1])

    def aimed(self, point):
        if point not in self.points:
            return False
        if point == "up":
            return os.environ.get("DMLC_NODE_HOST") == self.args.fault_host
        return self.rank == self.args.fault_rank

    def mark(self, point, step=None):
        """Prints the point's line and makes the injected fault if it is this point's."""
        say("fault-point %s attempt %d%s" % (point, self.attempt,
                                             "" if step is None else " step %d" % step))
        if self.injected is not None and self.injected[1] == point:
            strike(self.injected[0], point)

    def inject_only(self, point):
        """Whether the injected fault of this attempt is at `point` (it strikes inside a
        call, see wrap)."""
        return self.injected is not None and self.injected[1] == point


def strike(kind, point):
    if kind == "value-error":
        raise ValueError("fault sweep: a ValueError injected at %s" % point)
    while True:   # a hang: the attempt ends at the launcher's --job-timeout
        time.sleep(3600)


def wrap(trainer, method, marks, point, step=None):
    """Makes the injected fault (with its line) inside trainer.<method> (save_states,
    load_states), which save_checkpoint / load_checkpoint call between their files."""
    original = getattr(trainer, method)

    def faulty(*args, **kwargs):
        marks.mark(point, step)
        return original(*args, **kwargs)
    setattr(trainer, method, faulty)


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


def save(trainer, args, marks, step):
    prefix = checkpoint_index.step_prefix(args.checkpoints, RUN_NAME, step)
    say("saving %s attempt %d" % (prefix, marks.attempt))
    if step == args.save_step and marks.aimed("save") and marks.inject_only("save"):
        wrap(trainer, "save_states", marks, "save", step)
    odsgd.save_checkpoint(trainer, prefix, extra={"attempt": marks.attempt})
    print("saved %s attempt %d" % (prefix, marks.attempt), flush=True)


def resume(trainer, args, marks):
    """The step to start after: resume_or_start on --checkpoints (0 without)."""
    if not args.checkpoints:
        first = 0
    else:
        if marks.aimed("load"):
            if marks.inject_only("load"):
                wrap(trainer, "load_states", marks, "load")
            else:
                marks.mark("load")
        first = odsgd.resume_or_start(trainer, args.checkpoints)
    say("resumed from step %d attempt %d" % (first, marks.attempt))
    return first


def wait_for_rounds(marks, step, point):
    """Marks `point` right after trainer.step, then waits for the step's rounds (unless the
    fault stops them) and says how long they took."""
    marks.mark(point, step)
    marked = time.time()
    mx.nd.waitall()
    print("rounds of step %d done %.3f s after the mark attempt %d"
          % (step, time.time() - marked, marks.attempt), flush=True)


def train_step(net, trainer, args, marks, step, first):
    x, y = batch(args.seed, marks.rank, step)
    with mx.autograd.record():
        loss = ((net(x) - y) ** 2).mean()
    loss.backward()
    if step == args.fault_step and marks.aimed("before-push"):
        mx.nd.waitall()   # nothing of this worker in flight: the fault comes before the push
        marks.mark("before-push", step)
        time.sleep(args.pause)
    trainer.step(BATCH)
    if step == args.fault_step and marks.aimed("in-flight"):
        wait_for_rounds(marks, step, "in-flight")
    elif first and marks.aimed("first-step"):
        wait_for_rounds(marks, step, "first-step")
    say("step %d attempt %d" % (step, marks.attempt) + " loss %.6f" % loss.asscalar())


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
    marks = Marks(args, restarts.attempt_number())
    if marks.aimed("up"):
        marks.mark("up")
    net = build(args.seed)
    kv = odsgd.DistODSGD(warmup_steps=3)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4},
                               kvstore=kv)
    marks.rank = kv.rank
    say("rank %d attempt %d" % (kv.rank, marks.attempt))
    first = resume(trainer, args, marks)
    for step in range(first + 1, args.steps + 1):
        train_step(net, trainer, args, marks, step, step == first + 1)
        time.sleep(args.step_sleep)
        if args.save_every and step % args.save_every == 0:
            save(trainer, args, marks, step)
    write_weights(net, trainer, args, kv.rank)
    print("finished attempt %d" % marks.attempt, flush=True)


if __name__ == "__main__":
    main()
