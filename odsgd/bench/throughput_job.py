"""Cluster job of the throughput benchmark: trains a model on synthetic data for a number of
steps and writes this worker's samples/s (and, for dist_odsgd, its overlap meter) as JSON.

Modes: `--kvstore dist_sync|dist_async|dist_odsgd` trains; `--measure compute` times one
step of forward/backward alone (no kvstore, run as a single process); `--measure comm` times
push + pull of every parameter with no computation (a dist_sync job). With `--compute-ms` the
worker is accelerator-paced (odsgd/bench/paced.py): the model's trained arrays at
`--byte-scale`, and a wait of that many ms in place of forward and backward.
"""
import argparse
import json
import os
import time

import odsgd  # registers dist_odsgd; on servers it loads only the server side
from odsgd.worker import trace as timeline
from odsgd.bench import cpu_meter, paced
import mxnet as mx
import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp", help=MODEL_HELP)
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--mlp-hidden", type=int, default=1024, help="hidden units of 'mlp'")
    p.add_argument("--dense-layers", type=int, default=81, help="layers of 'dense'")
    p.add_argument("--dense-width", type=int, default=16, help="units per layer of 'dense'")
    p.add_argument("--kvstore", default="dist_odsgd")
    p.add_argument("--measure", choices=["train", "compute", "comm"], default="train")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--skip", type=int, default=8, help="untimed steps first")
    p.add_argument("--compute-ms", type=float, default=None,
                   help="accelerator-paced: wait this long per step instead of computing")
    p.add_argument("--byte-scale", type=int, default=1,
                   help="accelerator-paced: every array's element count divided by this")
    p.add_argument("--out", required=True, help="folder for rank<r>.json")
    return p.parse_args(argv)


MLP_IN, CLASSES = 1024, 10
MODEL_HELP = ("mlp (1024-hidden-hidden-10, 2.1 M parameters), dense (many small Dense layers: "
              "--dense-layers x Dense(--dense-width), 2 arrays each), cifar_resnet20_v1 "
              "(10 classes, 65 arrays; use --image-size 32), or any GluonCV ImageNet model "
              "such as resnet18_v1, resnet50_v1 (1000 classes)")


def mlp_parameter_count(hidden):
    """Parameters of the benchmark MLP 1024-hidden-hidden-10 (2,109,450 for hidden=1024)."""
    return MLP_IN * hidden + hidden + hidden * hidden + hidden + hidden * CLASSES + CLASSES


def build_model(name, image_size, mlp_hidden=1024, dense_layers=81, dense_width=16):
    """(net, input shape without batch, classes), initialised and hybridized."""
    if name == "mlp":
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(mlp_hidden, activation="relu", in_units=MLP_IN),
                mx.gluon.nn.Dense(mlp_hidden, activation="relu", in_units=mlp_hidden),
                mx.gluon.nn.Dense(CLASSES, in_units=mlp_hidden))
        shape, classes = (MLP_IN,), CLASSES
    elif name == "dense":
        # The shape of work that per-array overhead hurts most: 2 * dense_layers small arrays.
        net = mx.gluon.nn.HybridSequential()
        for _ in range(dense_layers - 1):
            net.add(mx.gluon.nn.Dense(dense_width, activation="relu", in_units=dense_width))
        net.add(mx.gluon.nn.Dense(CLASSES, in_units=dense_width))
        shape, classes = (dense_width,), CLASSES
    else:
        from gluoncv.model_zoo import get_model
        classes = 10 if name.startswith("cifar_") else 1000
        net = get_model(name, classes=classes)
        shape = (3, image_size, image_size)
    net.initialize(mx.init.Xavier(magnitude=2))
    net.hybridize(static_alloc=True, static_shape=True)
    return net, shape, classes


def synthetic_batch(shape, classes, batch_size):
    rng = np.random.RandomState(0)
    data = mx.nd.array(rng.uniform(-1, 1, (batch_size,) + shape))
    label = mx.nd.array(rng.randint(0, classes, batch_size))
    return data, label


def timed(step, skip, steps, progress_every=5.0, settle=None):
    """Seconds per step of `step()` over `steps` steps after `skip` untimed ones, and a dict:
    the timed window (wall-clock start, end), this process's CPU seconds in it (all threads)
    and, where the benchmark's CPU meter marks the job (odsgd.bench.cpu_meter.MARKER in the
    environment), `cpu_edges`: the CPU seconds of every process of the job read at the
    window's start and at its end (cpu_meter.edge_sample), so that the meter has a sample at
    both edges however short the window is.

    `settle()` waits until the steps issued so far are done as far as the next step needs
    (default mx.nd.waitall: everything). Training passes a wait for the trained weights: the
    window's edges are then the moments a next step could start, and a mode that keeps a
    round in flight across steps (dist_odsgd's answer of the last step, dist_async's) has
    one in flight at both edges, as in a long run. A wait for everything there drains that
    round at each edge and at each progress line, a stall a long run never has (with 0.8 s
    steps it cost dist_odsgd a fifth of its rate).

    Prints a progress line at most every `progress_every` seconds: the benchmark ends a job
    whose output stops (odsgd.bench.jobs.run_job's stall timeout)."""
    settle = settle or mx.nd.waitall
    last = [time.time()]

    def run(count, label):
        for i in range(count):
            step()
            if time.time() - last[0] >= progress_every:
                settle()
                print("%s step %d/%d" % (label, i + 1, count), flush=True)
                last[0] = time.time()

    run(skip, "untimed")
    settle()
    # Every process of the job runs by now (the untimed steps needed them): find them before
    # the window, read only their /proc/<pid>/stat at its edges.
    processes = cpu_meter.job_processes()
    first = cpu_meter.edge_sample(processes)
    tic, cpu = time.time(), time.process_time()
    run(steps, "timed")
    settle()
    toc = time.time()
    cpu = time.process_time() - cpu
    result = {"window": [tic, toc], "cpu_seconds": cpu}
    if processes:
        result["cpu_edges"] = [first, cpu_meter.edge_sample(processes)]
    mx.nd.waitall()
    return (toc - tic) / steps, result


def model_step(args, trainer_for=None):
    """(params, step): the trained parameters (a ParameterDict) and a function that runs one
    step, then `trainer.step` when `trainer_for(params)` gives a Trainer: the model's forward
    and backward on one synthetic batch, or with --compute-ms the paced worker's wait. The
    step's `settle()` waits for the trained weights, the moment a next step could start
    (timed's window edges)."""
    if args.compute_ms is not None:
        params = paced.paced_parameters(args.model, args.byte_scale)
        trainer = trainer_for(params) if trainer_for else None
        return params, paced.paced_step(params, args.compute_ms / 1e3, trainer,
                                        args.batch_size)
    net, shape, classes = build_model(args.model, args.image_size, args.mlp_hidden,
                                      args.dense_layers, args.dense_width)
    # The first forward (it finishes deferred initialisation) runs in training mode: an
    # inference forward leaves convolution weights in an MKL-DNN layout, and MXNet 1.9's
    # dist_sync then pushes them with the wrong size (the server aborts with "init N first",
    # or a pull never returns). docs/benchmarks.md, "ResNets on CPU".
    with mx.autograd.record():
        net(mx.nd.zeros((1,) + shape))
    params = net.collect_params()
    trainer = trainer_for(params) if trainer_for else None
    data, label = synthetic_batch(shape, classes, args.batch_size)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        if trainer is not None:
            trainer.step(args.batch_size)
    weights = trained_arrays(params)
    step.settle = lambda: paced.wait_for_weights(weights)
    return params, step


def trained_arrays(params):
    """The weights of the trained parameters in gluon.Trainer's order (it sorts them by
    name; the store's keys follow it)."""
    return [params[name].data() for name in sorted(params.keys())
            if params[name].grad_req != "null"]


def measure_compute(args):
    params, step = model_step(args)
    seconds, window = timed(step, args.skip, args.steps)
    trained = trained_arrays(params)
    return dict(window, t_comp=seconds, parameter_arrays=len(trained),
                parameter_bytes=sum(w.size * w.dtype(0).itemsize for w in trained),
                parameter_sizes=[int(w.size) for w in trained]), 0


def measure_comm(args):
    kv = mx.kv.create("dist_sync")
    params, _ = model_step(args)
    weights = trained_arrays(params)
    grads = [mx.nd.zeros_like(w) for w in weights]
    for i, w in enumerate(weights):
        kv.init(i, w)

    def step():
        for i, (g, w) in enumerate(zip(grads, weights)):
            kv.push(i, g, priority=-i)
            kv.pull(i, out=w, priority=-i)
    seconds, window = timed(step, 2, max(3, args.steps // 3))
    return dict(window, t_comm=seconds), kv.rank


def measure_training(args):
    kv = mx.kv.create(args.kvstore)
    timeline.start_if_asked(kv.rank)     # ODSGD_TIMELINE set: record a trace (no-op unset)
    _, step = model_step(args, lambda params: mx.gluon.Trainer(
        params, "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv))
    meter = kv.overlap if isinstance(kv, odsgd.DistODSGD) else None
    interval = meter.interval if meter is not None else 0
    if meter is not None:
        meter.interval = 0   # its sampled steps block the worker: none in the timed window
    seconds, window = timed(step, args.skip, args.steps, settle=step.settle)
    result = dict(window, seconds_per_step=seconds, samples_per_sec=args.batch_size / seconds)
    if getattr(step, "phases", None):
        # a paced worker: where its timed steps' time went (paced.PHASES)
        result["paced_phases"] = paced.phase_means(step.phases[args.skip:args.skip + args.steps])
    if interval:
        # after the window, on every worker alike (the steps are synchronous): two samples
        meter.interval = interval
        for _ in range(2 * interval):
            step()
        mx.nd.waitall()
        result["overlap"] = meter.summary()
    return result, kv.rank


def main(argv=None):
    args = parse_args(argv)
    measure = {"train": measure_training, "compute": measure_compute,
               "comm": measure_comm}[args.measure]
    result, rank = measure(args)
    with open(os.path.join(args.out, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
