"""Job of tests/test_autoload.py: a training script that never imports odsgd and names the
store only as the string 'dist_odsgd', as MXNet's example/image-classification (`--kv-store`)
and GluonCV's scripts (`--kvstore`) do. Each worker prints one JSON line per path: the class
of the store it got, and for Module the gradient scale Module chose."""
import json
import sys

import mxnet as mx
import numpy as np

BATCH = 8


def report(path, store, **extra):
    line = {"path": path, "rank": store.rank, "store": "%s.%s" % (type(store).__module__,
                                                                 type(store).__name__),
            "type": str(store.type), "num_workers": store.num_workers}
    line.update(extra)
    print("no_import_job " + json.dumps(line), flush=True)


def created():
    kv = mx.kv.create("dist_odsgd")
    report("create", kv)
    return kv


def gluon_trainer():
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize(mx.init.Constant(0.1))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "wd": 1e-4},
                               kvstore="dist_odsgd")
    x = mx.nd.ones((BATCH, 4))
    for _ in range(2):
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(BATCH)
    mx.nd.waitall()
    report("gluon", trainer._kvstore)


def module_fit():
    data = mx.sym.Variable("data")
    out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=3, name="fc"),
                               name="softmax")
    rng = np.random.RandomState(0)
    train = mx.io.NDArrayIter(rng.rand(2 * BATCH, 4).astype("float32"),
                              rng.randint(0, 3, 2 * BATCH).astype("float32"), BATCH)
    mod = mx.mod.Module(out, context=mx.cpu())
    mod.fit(train, num_epoch=1, kvstore="dist_odsgd", optimizer="sgd",
            optimizer_params={"learning_rate": 0.1}, initializer=mx.init.Constant(0.1))
    mx.nd.waitall()
    report("module", mod._kvstore, rescale_grad=mod._optimizer.rescale_grad, batch=BATCH)


if __name__ == "__main__":
    assert "odsgd" not in sys.modules, "the job must not import odsgd itself"
    {"create": created, "gluon": gluon_trainer, "module": module_fit}[sys.argv[1]]()
