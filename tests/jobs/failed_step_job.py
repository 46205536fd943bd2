"""Cluster job of tests/test_layouts.py: a step that fails part way on one worker, caught by
the training loop.

Two Dense layers on three key groups (ODSGD_FUSION_ELEMENTS=0 in the test's environment: a
weight and a bias of the first layer, the second's weight; its bias is frozen). On worker
--rank, the local update of the second key group raises once at step --fail-at, after that
group's round was sent and before the third group's was. The loop catches every exception of
trainer.step, prints `caught <type>: <message>`, tries odsgd.save_checkpoint in the handler
(printing what it raised) and goes on, as a careless training loop would. Every worker saves
a good checkpoint to the same prefix after step --good-save-at, before the failure: the
handler's save must leave it whole."""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fail-at", type=int, default=5)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--prefix", required=True)
    p.add_argument("--good-save-at", type=int, default=3)
    p.add_argument("--fail-group", type=int, default=1,
                   help="the position of the failing key group in the step (of --groups)")
    p.add_argument("--groups", type=int, default=3, help="key groups a step makes")
    return p.parse_args()


def fail_once(kv, step, group_position, groups):
    """Makes the local update of the key group at `group_position` (in the step's order, of
    `groups`) raise once, at global step `step`."""
    update = kv.local.update_group
    calls = {"n": 0}

    def failing(group, at, *rest):
        calls["n"] += 1
        if at == step and (calls["n"] - 1) % groups == group_position:
            kv.local.update_group = update
            raise RuntimeError("injected failure of the local update")
        return update(group, at, *rest)
    kv.local.update_group = failing


def main():
    args = parse_args()
    kv = odsgd.DistODSGD()
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, in_units=3), mx.gluon.nn.Dense(2, in_units=4))
    net.initialize(mx.init.Constant(0.1))
    list(net.collect_params().values())[3].grad_req = "null"
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
    if args.fail_at == 0 and kv.rank == args.rank:
        trainer._optimizer.rescale_grad = 1.0 / 2   # what trainer.step(2) sets, before the store
        trainer._init_kvstore()   # the store has its local update now: fail in the first step
        fail_once(kv, args.fail_at, args.fail_group, args.groups)
    for step in range(args.steps):
        rng = np.random.RandomState(10 * kv.rank + step)
        data = mx.nd.array(rng.randn(2, 3))
        with mx.autograd.record():
            loss = net(data).sum()
        loss.backward()
        if step == 1 and kv.rank == args.rank and args.fail_at > 1:
            fail_once(kv, args.fail_at, args.fail_group, args.groups)   # local update made by now
        try:
            trainer.step(2)
        except Exception as error:  # noqa: BLE001 - the careless loop under test
            say("caught %s: %s" % (type(error).__name__, error))
            for what, call in (("save", lambda: odsgd.save_checkpoint(trainer, args.prefix)),
                               ("set_optimizer", lambda: kv.set_optimizer(trainer._optimizer)),
                               ("barrier", kv._barrier)):
                try:
                    call()
                except Exception as refused:  # noqa: BLE001
                    say("%s refused: %s: %s" % (what, type(refused).__name__, refused))
        if step == args.good_save_at:
            odsgd.save_checkpoint(trainer, args.prefix)
        print("step %d done" % step, flush=True)


def say(message, said=set()):
    """Prints `message` the first time (the launcher keeps the last lines only)."""
    if message not in said:
        said.add(message)
        print(message, flush=True)


if __name__ == "__main__":
    main()
