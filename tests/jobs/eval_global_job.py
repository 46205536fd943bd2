"""Cluster job of tests/test_eval_global.py: a small MLP trained with dist_odsgd (OD phase from
the first step, global SGD with momentum, weight decay and per-parameter lr_mult / wd_mult),
through Module.fit or a gluon.Trainer loop, with or without evaluations between epochs.

At the end of every epoch, after its last step and before any evaluation, the worker records
its local weights w_t (`local<e>_<name>`) and the newest global weights W pulled into arrays
of its own (`global<e>_<name>`). With --evaluate it then evaluates the training network on
validation data, as MXNet's fit.py does (Module: fit's own score; Gluon: `net(x)` outside
autograd.record()), and records what the evaluation forward computed (`outputs<e>`), and for
Module the arg_params fit.py hands its epoch-end callback (`checkpoint<e>_<name>`).

Writes OUT/rank<r>.npz with those and the validation inputs (`val_x`). Started through
odsgd.launch; ODSGD_EVAL_WEIGHTS comes from the environment."""
import argparse
import os

import odsgd  # noqa: F401  (registers dist_odsgd; on servers it only loads the server side)
import mxnet as mx
import numpy as np

FEATURES, HIDDEN, CLASSES = 6, 8, 3
BATCH, TRAIN_BATCHES, VAL_SIZE = 4, 5, 7
OPTIMIZER = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}
#: per-parameter multipliers (Module: symbol attributes; Gluon: Parameter attributes)
MULTIPLIERS = {"fc1_weight": {"lr_mult": 0.5, "wd_mult": 2.0},
               "fc2_weight": {"lr_mult": 2.0, "wd_mult": 0.5}}


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=["module", "gluon"], required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--evaluate", action="store_true")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def dataset(rank):
    rng = np.random.RandomState(7 + rank)
    x = rng.uniform(-1, 1, (BATCH * TRAIN_BATCHES, FEATURES)).astype(np.float32)
    y = rng.randint(0, CLASSES, len(x)).astype(np.float32)
    return x, y


def validation_inputs():
    return np.random.RandomState(99).uniform(-1, 1, (VAL_SIZE, FEATURES)).astype(np.float32)


def initial_params():
    rng = np.random.RandomState(3)
    return {"fc1_weight": rng.normal(0, 0.5, (HIDDEN, FEATURES)).astype(np.float32),
            "fc1_bias": rng.normal(0, 0.1, HIDDEN).astype(np.float32),
            "fc2_weight": rng.normal(0, 0.5, (CLASSES, HIDDEN)).astype(np.float32),
            "fc2_bias": rng.normal(0, 0.1, CLASSES).astype(np.float32)}


def store():
    return odsgd.DistODSGD(warmup_steps=0)   # 'predict', every step in the OD phase


class EpochRecords(object):
    """name -> array, per epoch: w_t and W at the epoch's end, what the evaluation saw."""

    def __init__(self, kv):
        self.kv, self.values = kv, {}

    def weights(self, epoch, names, keys, arrays):
        pulled = [mx.nd.zeros(a.shape) for a in arrays]
        self.kv.pull(keys, out=pulled)
        for name, array, pulled_array in zip(names, arrays, pulled):
            self.values["local%d_%s" % (epoch, name)] = array.asnumpy()
            self.values["global%d_%s" % (epoch, name)] = pulled_array.asnumpy()


class OutputsMetric(mx.metric.EvalMetric):
    """Keeps what fit.py's score computed (the evaluation forward's outputs)."""

    def __init__(self, records):
        super(OutputsMetric, self).__init__("outputs")
        self.records, self.epoch = records, 0

    def update(self, labels, preds):
        self.records.values["outputs%d" % self.epoch] = preds[0].asnumpy()[:VAL_SIZE]
        self.epoch += 1
        self.sum_metric, self.num_inst = 0.0, 1


def module_symbol():
    data = mx.sym.var("data")
    weights = {name: mx.sym.var(name, **{k: str(v) for k, v in mult.items()})
               for name, mult in MULTIPLIERS.items()}
    net = mx.sym.FullyConnected(data, weight=weights["fc1_weight"], num_hidden=HIDDEN,
                                name="fc1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, weight=weights["fc2_weight"], num_hidden=CLASSES,
                                name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def run_module(args, kv, records):
    x, y = dataset(kv.rank)
    train = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    val = mx.io.NDArrayIter(validation_inputs(), np.zeros(VAL_SIZE, np.float32),
                            batch_size=VAL_SIZE, label_name="softmax_label")
    mod = mx.mod.Module(module_symbol(), context=mx.cpu())

    def epoch_end(param):
        if param.locals.get("end_of_batch"):
            group = mod._exec_group
            records.weights(param.epoch, group.param_names, group.param_names,
                            [a[0] for a in group.param_arrays])

    def checkpoint(epoch, _symbol, arg_params, _aux_params):
        for name, value in arg_params.items():
            records.values["checkpoint%d_%s" % (epoch, name)] = value.asnumpy()

    mod.fit(train, eval_data=val if args.evaluate else None, num_epoch=args.epochs,
            kvstore=kv, optimizer="sgd", optimizer_params=OPTIMIZER,
            eval_metric="acc", validation_metric=OutputsMetric(records),
            arg_params={k: mx.nd.array(v) for k, v in initial_params().items()},
            batch_end_callback=epoch_end,
            epoch_end_callback=checkpoint if args.evaluate else None)


def gluon_net():
    net = mx.gluon.nn.HybridSequential(prefix="")
    with net.name_scope():
        net.add(mx.gluon.nn.Dense(HIDDEN, in_units=FEATURES, activation="relu", prefix="fc1_"),
                mx.gluon.nn.Dense(CLASSES, in_units=HIDDEN, prefix="fc2_"))
    net.initialize()
    params = net.collect_params()
    for name, value in initial_params().items():
        params[name].set_data(mx.nd.array(value))
    for name, mult in MULTIPLIERS.items():
        params[name].lr_mult, params[name].wd_mult = mult["lr_mult"], mult["wd_mult"]
    return net


def run_gluon(args, kv, records):
    net = gluon_net()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", OPTIMIZER, kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = dataset(kv.rank)
    names = [p.name for p in trainer._params]
    for epoch in range(args.epochs):
        for b in range(TRAIN_BATCHES):
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.array(x[b * BATCH:(b + 1) * BATCH])),
                               mx.nd.array(y[b * BATCH:(b + 1) * BATCH]))
            loss.backward()
            trainer.step(BATCH)
        records.weights(epoch, names, list(range(len(names))),
                        [p.data() for p in trainer._params])
        if args.evaluate:   # the evaluation of GluonCV's scripts: net(x) outside record()
            outputs = mx.nd.softmax(net(mx.nd.array(validation_inputs())))
            records.values["outputs%d" % epoch] = outputs.asnumpy()


def main():
    args = parse_args()
    kv = store()
    records = EpochRecords(kv)
    (run_module if args.api == "module" else run_gluon)(args, kv, records)
    mx.nd.waitall()
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), val_x=validation_inputs(),
             eval_weights=kv.config.eval_weights, **records.values)
    print("rank %d finished %d epochs" % (kv.rank, args.epochs), flush=True)


if __name__ == "__main__":
    main()
