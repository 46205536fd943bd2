"""Cluster job of tests/test_eval_layouts.py: a small conv net (2 convolutions + a dense
layer) trained for a few epochs with evaluation on the training network itself between
epochs, which is what leaves MXNet's CPU build keeping conv weights in an MKL-DNN layout.

--api module: `Module.fit(train, eval_data=val)`.
--api gluon: a `gluon.Trainer` loop that runs `net(x)` outside autograd (inference mode) on
             validation batches after every epoch.

After the first epoch both load the newest global weights into the parameters
(odsgd.load_global_weights) and train on from there: with lam != 0 the fused local update
must then read w_t from the parameters again, as the fallback does.

Writes OUT/rank<r>.npz: the newest global weights after the last step (`global_<name>`), this
worker's parameters after each epoch as the API gives them (`epoch<e>_<name>`: for Module,
get_params, which shows the global weights under ODSGD_EVAL_WEIGHTS=global), and what the worker ran on
(`native_loaded`, `odsgd_native_lib`). Started through odsgd.launch."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402  (registers dist_odsgd; on servers it only loads the server side)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

CHANNELS, SIZE, CLASSES = 3, 8, 4
BATCH, TRAIN_BATCHES, VAL_BATCHES = 8, 6, 2


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=["module", "gluon"], required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--compensation", type=float, default=0.1,
                   help="lam: 0 makes the local update write the weights as outputs only")
    return p.parse_args(argv)


def dataset(rank, batches, seed):
    """(images (batches*BATCH, C, S, S), labels) of worker `rank`, float32, seeded."""
    rng = np.random.RandomState(seed + 10 * rank)
    images = rng.uniform(-1, 1, (batches * BATCH, CHANNELS, SIZE, SIZE)).astype(np.float32)
    labels = rng.randint(0, CLASSES, batches * BATCH).astype(np.float32)
    return images, labels


def initial_params():
    """name -> float32 array: the same initial weights on every worker and every run."""
    rng = np.random.RandomState(3)
    shapes = {"conv0_weight": (8, CHANNELS, 3, 3), "conv0_bias": (8,),
              "conv1_weight": (8, 8, 3, 3), "conv1_bias": (8,),
              "dense0_weight": (CLASSES, 8 * 4 * 4), "dense0_bias": (CLASSES,)}
    return {name: (0.3 * rng.standard_normal(shape)).astype(np.float32)
            for name, shape in shapes.items()}


def store(compensation):
    # Every step in the OD phase, with momentum (and the compensation term when lam > 0):
    # the fused op (or its fallback) runs on every parameter at every step.
    return odsgd.DistODSGD(local_optimizer="sgd",
                           local_optimizer_params={"learning_rate": 0.05, "momentum": 0.9},
                           compensation=compensation, warmup_steps=0)


OPTIMIZER = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}


def run_module(args, kv):
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, num_filter=8, kernel=(3, 3), name="conv0")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.Convolution(net, num_filter=8, kernel=(3, 3), name="conv1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=CLASSES, name="dense0")
    net = mx.sym.SoftmaxOutput(net, name="softmax")
    train = mx.io.NDArrayIter(*dataset(kv.rank, TRAIN_BATCHES, 100), batch_size=BATCH,
                              label_name="softmax_label")
    val = mx.io.NDArrayIter(*dataset(kv.rank, VAL_BATCHES, 200), batch_size=BATCH,
                            label_name="softmax_label")
    mod = mx.mod.Module(net, context=mx.cpu())
    snapshots = {}

    def snapshot(epoch, _symbol, arg_params, _aux_params):
        for name, value in arg_params.items():
            snapshots["epoch%d_%s" % (epoch, name)] = value.asnumpy()
        if epoch == 0:
            odsgd.load_global_weights(mod)     # training goes on from W

    mod.fit(train, eval_data=val, num_epoch=args.epochs, kvstore=kv, optimizer="sgd",
            optimizer_params=OPTIMIZER, eval_metric="acc",
            arg_params={k: mx.nd.array(v) for k, v in initial_params().items()},
            epoch_end_callback=snapshot)
    odsgd.load_global_weights(mod)
    arg_params, _ = mod.get_params()
    snapshots.update(("global_" + k, v.asnumpy()) for k, v in arg_params.items())
    return snapshots


def gluon_net():
    net = mx.gluon.nn.HybridSequential(prefix="")
    with net.name_scope():
        net.add(mx.gluon.nn.Conv2D(8, 3, in_channels=CHANNELS, activation="relu",
                                   prefix="conv0_"),
                mx.gluon.nn.Conv2D(8, 3, in_channels=8, activation="relu", prefix="conv1_"),
                mx.gluon.nn.Dense(CLASSES, in_units=8 * 4 * 4, prefix="dense0_"))
    net.initialize()
    for name, value in initial_params().items():
        net.collect_params()[name].set_data(mx.nd.array(value))
    return net


def run_gluon(args, kv):
    net = gluon_net()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPTIMIZER, kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    X, Y = dataset(kv.rank, TRAIN_BATCHES, 100)
    VX, VY = dataset(kv.rank, VAL_BATCHES, 200)
    snapshots = {}
    for epoch in range(args.epochs):
        for b in range(TRAIN_BATCHES):
            x = mx.nd.array(X[b * BATCH:(b + 1) * BATCH])
            y = mx.nd.array(Y[b * BATCH:(b + 1) * BATCH])
            with mx.autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(BATCH)
        # Evaluation with the training network itself: an inference-mode forward.
        metric = mx.metric.Accuracy()
        for b in range(VAL_BATCHES):
            metric.update([mx.nd.array(VY[b * BATCH:(b + 1) * BATCH])],
                          [net(mx.nd.array(VX[b * BATCH:(b + 1) * BATCH]))])
        print("epoch %d validation %s=%.3f" % ((epoch,) + metric.get()), flush=True)
        for name, param in net.collect_params().items():
            snapshots["epoch%d_%s" % (epoch, name)] = param.data().asnumpy()
        if epoch == 0:
            odsgd.load_global_weights(trainer)     # training goes on from W
    odsgd.load_global_weights(trainer)
    snapshots.update(("global_" + name, param.data().asnumpy())
                     for name, param in net.collect_params().items())
    return snapshots


def main():
    args = parse_args()
    kv = store(args.compensation)
    snapshots = run_module(args, kv) if args.api == "module" else run_gluon(args, kv)
    mx.nd.waitall()
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank),
             native_loaded=odsgd.native.is_loaded(),
             odsgd_native_lib=os.environ.get("ODSGD_NATIVE_LIB", ""), **snapshots)
    print("rank %d finished %d epochs" % (kv.rank, args.epochs), flush=True)


if __name__ == "__main__":
    main()
