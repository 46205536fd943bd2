"""Cluster job of the per-parameter-rate tests: a 2-layer net with biases and BatchNorm, weight
decay, an lr_mult other than 1 on the first layer and wd_mult 0 on biases and BatchNorm's beta,
trained with Module.fit (symbolic) or gluon.Trainer on any kvstore. Writes every parameter
after each step (the worker's own weights) and the final global weights to OUT/rank<r>.npz.

Module: the first layer sits under mx.AttrScope(lr_mult='0.3'); Module gives every parameter
whose name does not end in _weight or _gamma a wd_mult of 0. Gluon: the same multipliers set
on the Parameters (lr_mult 0.3 on the first Dense, wd_mult 0 on biases and beta)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402,F401  (registers dist_odsgd; on servers only the server side)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

IN, HIDDEN, OUT, BATCH = 6, 5, 3, 8


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=["gluon", "module"], default="module")
    p.add_argument("--kvstore", default="dist_odsgd")
    p.add_argument("--update-on-kvstore", type=int, default=1)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def batches(rank, steps):
    rng = np.random.RandomState(500 + rank)
    X = rng.uniform(-1, 1, (steps * BATCH, IN)).astype(np.float32)
    Y = rng.uniform(-1, 1, (steps * BATCH, OUT)).astype(np.float32)
    return X, Y


def initial_params():
    rng = np.random.RandomState(3)
    return {"fc1_weight": rng.uniform(-0.5, 0.5, (HIDDEN, IN)),
            "fc1_bias": rng.uniform(-0.5, 0.5, (HIDDEN,)),
            "bn_gamma": rng.uniform(0.5, 1.5, (HIDDEN,)),
            "bn_beta": rng.uniform(-0.5, 0.5, (HIDDEN,)),
            "fc2_weight": rng.uniform(-0.5, 0.5, (OUT, HIDDEN)),
            "fc2_bias": rng.uniform(-0.5, 0.5, (OUT,))}


def run_module(args, kv):
    data, label = mx.sym.var("data"), mx.sym.var("label")
    with mx.AttrScope(lr_mult="0.3"):
        hidden = mx.sym.FullyConnected(data, num_hidden=HIDDEN, name="fc1")
    hidden = mx.sym.Activation(mx.sym.BatchNorm(hidden, fix_gamma=False, name="bn"), "relu")
    out = mx.sym.FullyConnected(hidden, num_hidden=OUT, name="fc2")
    loss = mx.sym.MakeLoss(0.5 * mx.sym.sum(mx.sym.square(out - label)))
    X, Y = batches(kv.rank, args.steps)
    train = mx.io.NDArrayIter(X, Y, batch_size=BATCH, shuffle=False, label_name="label")
    mod = mx.mod.Module(loss, data_names=["data"], label_names=["label"], context=mx.cpu())
    history = []

    def record(_param):
        arg_params, _ = mod.get_params()
        history.append({n: a.asnumpy() for n, a in arg_params.items()})

    arg = {n: mx.nd.array(v) for n, v in initial_params().items()}
    mod.fit(train, num_epoch=1, kvstore=kv, optimizer="sgd", eval_metric=mx.metric.Loss(),
            optimizer_params={"learning_rate": args.lr, "momentum": args.momentum,
                              "wd": args.wd},
            arg_params=arg, batch_end_callback=record)
    if isinstance(kv, odsgd.DistODSGD):
        odsgd.load_global_weights(mod)
    else:
        for name, arrays in zip(mod._exec_group.param_names, mod._exec_group.param_arrays):
            kv.pull(name, out=arrays)
    arg_params, _ = mod.get_params()
    return history, {n: a.asnumpy() for n, a in arg_params.items()}


class Net(mx.gluon.HybridBlock):
    def __init__(self):
        super(Net, self).__init__()
        with self.name_scope():
            self.fc1 = mx.gluon.nn.Dense(HIDDEN, in_units=IN, prefix="fc1_")
            self.bn = mx.gluon.nn.BatchNorm(in_channels=HIDDEN, prefix="bn_")
            self.fc2 = mx.gluon.nn.Dense(OUT, in_units=HIDDEN, prefix="fc2_")

    def hybrid_forward(self, F, x):
        return self.fc2(F.Activation(self.bn(self.fc1(x)), "relu"))


def run_gluon(args, kv):
    net = Net()
    net.initialize()
    by_name = {param.name[len(net.prefix):]: param for param in net.collect_params().values()}
    for name, value in initial_params().items():
        by_name[name].set_data(mx.nd.array(value))
    for name in ("fc1_weight", "fc1_bias"):
        by_name[name].lr_mult = 0.3
    for name in ("fc1_bias", "fc2_bias", "bn_beta"):
        by_name[name].wd_mult = 0.0
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": args.lr, "momentum": args.momentum,
                                "wd": args.wd}, kvstore=kv,
                               update_on_kvstore=bool(args.update_on_kvstore))
    if not isinstance(kv, odsgd.DistODSGD) and not args.update_on_kvstore:
        # The baseline's own race (MXNet 1.9): Trainer's first step broadcasts W_0 (init, then
        # an async pull into the weights) and pushes gradients right after; the engine may send
        # a gradient push before that pull, and with update_on_kvstore=False the server then
        # answers the pull with the summed gradients, so one worker starts from them. Finishing
        # the broadcast first makes dist_sync a fixed reference. (With update_on_kvstore=True
        # a late pull returns W_1, which the step pulls anyway.)
        trainer._init_kvstore()
        trainer._init_params()
        mx.nd.waitall()
    X, Y = batches(kv.rank, args.steps)
    history = []
    for step in range(args.steps):
        x = mx.nd.array(X[step * BATCH:(step + 1) * BATCH])
        y = mx.nd.array(Y[step * BATCH:(step + 1) * BATCH])
        with mx.autograd.record():
            loss = 0.5 * ((net(x) - y) ** 2).sum()
        loss.backward()
        trainer.step(BATCH)
        history.append({n: p.data().asnumpy() for n, p in by_name.items()
                        if p.grad_req != "null"})
    if isinstance(kv, odsgd.DistODSGD):
        odsgd.load_global_weights(trainer)
    elif trainer._update_on_kvstore:
        for i, param in enumerate(trainer._params):
            if param.grad_req != "null":
                kv.pull(i, out=param.list_data())
    return history, {n: p.data().asnumpy() for n, p in by_name.items() if p.grad_req != "null"}


def main():
    args = parse_args()
    kv = mx.kv.create(args.kvstore)
    history, final = (run_module if args.api == "module" else run_gluon)(args, kv)
    arrays = {"final_" + n: v for n, v in final.items()}
    for name in history[0]:
        arrays["steps_" + name] = np.array([h[name] for h in history])
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), **arrays)


if __name__ == "__main__":
    main()
