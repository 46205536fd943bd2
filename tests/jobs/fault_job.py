"""Worker script of the fault-injection tests (tests/test_reliability.py): trains the quadratic
problem with gluon.Trainer on dist_odsgd, printing `step <t> pid <pid>` after every step, so a
test can wait for training to run and then inject a fault by pid.

Faults it can make itself: --raise-at STEP (an uncaught exception), --exit-at STEP with
--exit-code CODE (sys.exit), --hang-at STEP (sleeps forever, e.g. a dead data loader),
--refuse (the worker's Trainer has update_on_kvstore=False, which dist_odsgd refuses at the
first step)."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402

import quadratic_problem as problem  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--sleep", type=float, default=0.05, help="seconds after each step")
    p.add_argument("--rank", type=int, default=1, help="the worker that makes the fault")
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--exit-at", type=int, default=-1)
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--refuse", action="store_true",
                   help="worker --rank trains with update_on_kvstore=False (refused)")
    p.add_argument("--equal-steps", action="store_true",
                   help="call odsgd.equal_steps first (arms the step check at exit)")
    p.add_argument("--no-store", action="store_true",
                   help="workers create no store and exit 0 (as a script whose kvstore flag "
                   "became 'local'): the scheduler and servers wait for them forever")
    p.add_argument("--tag", default="", help="ignored; makes the command line unique")
    return p.parse_args(argv)


def main():
    args = parse_args()
    if args.no_store:
        print("trained without a distributed store", flush=True)
        return
    kv = odsgd.DistODSGD(warmup_steps=2)
    net = mx.gluon.nn.Dense(problem.OUT_UNITS, in_units=problem.IN_UNITS)
    net.initialize()
    refused = {"update_on_kvstore": False} if args.refuse and kv.rank == args.rank else {}
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01},
                               kvstore=kv, **refused)
    if args.equal_steps:
        odsgd.equal_steps(trainer, args.steps)
    for step in range(args.steps):
        if kv.rank == args.rank:
            if step == args.raise_at:
                raise RuntimeError("injected failure at step %d" % step)
            if step == args.exit_at:
                print("exiting with code %d at step %d" % (args.exit_code, step), flush=True)
                sys.exit(args.exit_code)
            if step == args.hang_at:
                print("hanging at step %d" % step, flush=True)
                time.sleep(10 ** 6)
        X, Y = problem.batch(kv.rank, step)
        with mx.autograd.record():
            loss = 0.5 * ((net(mx.nd.array(X)) - mx.nd.array(Y)) ** 2).sum()
        loss.backward()
        trainer.step(problem.BATCH)
        print("step %d pid %d loss %.4f" % (step, os.getpid(), loss.asscalar()), flush=True)
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
