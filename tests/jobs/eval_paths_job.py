"""Cluster job of tests/test_eval_paths.py: what a script does while the global weights W are
shown to an evaluation (odsgd/worker/eval_weights.py), against the same run without the evaluation.

Gluon (an MLP 20 -> 30 -> 5 on dist_odsgd, global SGD with momentum 0.9 and wd 1e-4, data that
depends only on the rank and the step), --case:

  plain      nothing besides training
  write      after step --at, every parameter written in place with values of the user's own
  ema        after step --at, an evaluation (W shown), then the same writes as 'write'
  between    at step --at, an inference call between the recorded forward and its backward
  thread     an evaluation thread calls the network while the main thread trains
  interrupt  after step --at, an evaluation whose swap to W is interrupted half way (Ctrl-C
             inside the pull), caught by the script, which trains on

It writes each worker's own weights and the global ones after the last step to OUT/rank<r>.npz.

Module (--case module-backward): a forward(is_train=False) after step --at, then backward();
the job prints the error it raised ('refused: ...') and trains on with a training forward.
"""
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402

import mlp_job  # noqa: E402

mlp = mlp_job.MLP(in_units=20, hidden=30, classes=5, batch_size=8)


def parse_args():
    p = mlp_job.arguments(steps=16)
    p.add_argument("--case", default="plain")
    p.add_argument("--at", type=int, default=8)
    return p.parse_args()


def users_values(param):
    """What the 'write' and 'ema' cases write: values of the user's own, the same in both."""
    rng = np.random.RandomState(len(param.name))
    return mx.nd.array(rng.uniform(-0.1, 0.1, param.shape).astype(np.float32))


def interrupted_evaluation(kv, net):
    """An evaluation whose pull of W stops with KeyboardInterrupt after its first key."""
    pull = kv.pull

    def half_a_pull(keys, out=None, **kwargs):
        pull(keys[:1], out=out[:1], **kwargs)
        raise KeyboardInterrupt("Ctrl-C inside the swap")
    kv.pull = half_a_pull
    try:
        net(mlp.batch(0, 900)[0])
    except KeyboardInterrupt as stop:
        print("caught KeyboardInterrupt: %s" % stop, flush=True)
    finally:
        kv.pull = pull


def evaluation_thread(net, stop):
    """Inference calls in a thread of their own until `stop` is set."""
    data = mlp.batch(0, 901)[0]
    while not stop.is_set():
        net(data).wait_to_read()


def gluon(args):
    kv = odsgd.DistODSGD()
    net = mlp.network(seed=5)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}, kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    stop, evaluator = threading.Event(), None
    for step in range(args.steps):
        if args.case == "thread" and step == 2:
            evaluator = threading.Thread(target=evaluation_thread, args=(net, stop))
            evaluator.start()
        data, label = mlp.batch(kv.rank, step)
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        if args.case == "between" and step == args.at:
            net(mlp.batch(0, 902)[0]).wait_to_read()      # outside record(): shows W
        loss.backward()
        trainer.step(mlp.batch_size)
        if step + 1 == args.at:
            after_step(args.case, kv, net)
    stop.set()
    if evaluator is not None:
        evaluator.join()
    mx.nd.waitall()
    mlp_job.write_weights(args.out, kv.rank, net, lambda: odsgd.load_global_weights(trainer))


def after_step(case, kv, net):
    if case in ("ema", "write"):
        if case == "ema":
            net(mlp.batch(0, 903)[0]).wait_to_read()      # W shown
        for param in net.collect_params().values():
            param.data()[:] = users_values(param)
    elif case == "interrupt":
        interrupted_evaluation(kv, net)


def module(args):
    kv = odsgd.DistODSGD()
    data = mx.sym.var("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=mlp.hidden, name="fc1")
    out = mx.sym.FullyConnected(mx.sym.relu(hidden), num_hidden=mlp.classes, name="fc2")
    mod = mx.mod.Module(mx.sym.SoftmaxOutput(out, name="softmax"))
    mod.bind([("data", (mlp.batch_size, mlp.in_units))], [("softmax_label", (mlp.batch_size,))])
    mx.random.seed(5)
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore=kv, optimizer="sgd",
                       optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    for step in range(args.steps):
        data, label = mlp.batch(kv.rank, step)
        if step == args.at:
            mod.forward(mx.io.DataBatch([mlp.batch(0, 904)[0]], [label]), is_train=False)
            try:
                mod.backward()
            except ValueError as refused:
                print("refused: %s" % refused, flush=True)
        mod.forward(mx.io.DataBatch([data], [label]), is_train=True)
        mod.backward()
        mod.update()
    mx.nd.waitall()


def main():
    args = parse_args()
    if args.case == "module-backward":
        module(args)
    else:
        gluon(args)


if __name__ == "__main__":
    main()
