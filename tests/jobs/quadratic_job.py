"""Cluster job of the multi-process tests: trains the quadratic problem with gluon.Trainer or
Module.fit on any kvstore and writes each step's local weights and the final global weights
to OUT/rank<r>.npz. Started through odsgd.launch."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402  (registers dist_odsgd; on servers it only loads the server side)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import quadratic_problem as problem  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=["gluon", "module", "store"], default="gluon",
                   help="store: the store's own API (kv.init, kv.pull, kv.pushpull of both keys)")
    p.add_argument("--kvstore", default="dist_odsgd")
    p.add_argument("--optimizer", default="sgd", help="the global optimizer (sgd, nag)")
    p.add_argument("--store-by-name", type=int, default=0,
                   help="gluon: give the Trainer kvstore='dist_odsgd' by name, with the "
                        "store's defaults and ODSGD_* settings, as GluonCV's scripts do")
    p.add_argument("--record-global", type=int, default=0,
                   help="gluon: after every step, wait for it and kv.pull the global weights "
                        "W_{t+1} (saved as global_weight_steps / global_bias_steps)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--lr-change-step", type=int, default=-1)
    p.add_argument("--lr-change-to", type=float, default=0.0)
    p.add_argument("--lr-factor-step", type=int, default=0,
                   help="FactorScheduler(step, factor=0.5) on the global optimizer")
    p.add_argument("--gluoncv-warmup-steps", type=int, default=0,
                   help="> 0: GluonCV's LRSequential, linear warm-up over these steps from 0 "
                   "to --lr, then cosine to 0 at --steps (GluonCV recipes' schedule)")
    p.add_argument("--begin-num-update", type=int, default=0)
    p.add_argument("--lr-mult-weight", type=float, default=1.0,
                   help="lr_mult of the weight (Gluon Parameter, or Module symbol attribute)")
    p.add_argument("--wd-mult-bias", type=float, default=1.0,
                   help="wd_mult of the bias (Gluon; Module gives biases 0 by their name)")
    p.add_argument("--lr-mult-change-step", type=int, default=-1,
                   help="gluon: set the weight's lr_mult to --lr-mult-change-to at this step")
    p.add_argument("--lr-mult-change-to", type=float, default=0.0)
    p.add_argument("--epoch-every", type=int, default=0,
                   help="gluon: odsgd.equal_steps every N steps, as at each epoch's start "
                   "(its step check pushes probe rounds)")
    p.add_argument("--freeze-bias-steps", type=int, default=0,
                   help="gluon: the bias has grad_req 'null' for this many steps, then trains")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="store: float16 weights and gradients, with multi_precision SGD (the "
                        "gradients are computed in float32 from the float16 weights)")
    p.add_argument("--rank-init-offset", type=float, default=0.0,
                   help="store: worker r initialises the keys with W_0 + r * this (rank 0's "
                        "values must win)")
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="this rank sleeps --slow-seconds before every other step")
    p.add_argument("--slow-seconds", type=float, default=0.0)
    p.add_argument("--out", required=True)
    p.add_argument("--save-prefix", help="odsgd.save_checkpoint after the last step (gluon)")
    p.add_argument("--resume-prefix", help="odsgd.load_checkpoint before the first step, "
                   "which is then step --first-step (gluon)")
    p.add_argument("--first-step", type=int, default=0)
    # store settings (None: environment / defaults)
    p.add_argument("--local-optimizer")
    p.add_argument("--local-lr", type=float)
    p.add_argument("--local-momentum", type=float)
    p.add_argument("--local-wd", type=float)
    p.add_argument("--clip", type=float)
    p.add_argument("--compensation", type=float)
    p.add_argument("--compensation-mode")
    p.add_argument("--warmup-steps", type=int)
    return p.parse_args(argv)


def make_store(args):
    if args.kvstore != "dist_odsgd":
        return mx.kv.create(args.kvstore)
    params = {}
    for name, key in (("local_lr", "learning_rate"), ("local_momentum", "momentum"),
                      ("local_wd", "wd"), ("clip", "clip_gradient")):
        if getattr(args, name) is not None:
            params[key] = getattr(args, name)
    return odsgd.DistODSGD(local_optimizer=args.local_optimizer,
                           local_optimizer_params=params or None,
                           compensation=args.compensation,
                           compensation_mode=args.compensation_mode,
                           warmup_steps=args.warmup_steps)


def gluoncv_schedule(lr, warmup_steps, steps):
    """GluonCV's own scheduler objects, as its recipes build them (one iteration an epoch)."""
    from gluoncv.utils import LRScheduler, LRSequential
    return LRSequential([
        LRScheduler("linear", base_lr=0.0, target_lr=lr, nepochs=warmup_steps,
                    iters_per_epoch=1),
        LRScheduler("cosine", base_lr=lr, target_lr=0.0, nepochs=steps - warmup_steps,
                    iters_per_epoch=1)])


def optimizer_params(args):
    params = {"learning_rate": args.lr, "wd": args.wd, "begin_num_update": args.begin_num_update}
    if args.optimizer in ("sgd", "nag"):   # the others (lamb, nadam, ...) take no momentum
        params["momentum"] = args.momentum
    if args.lr_factor_step:
        params["lr_scheduler"] = mx.lr_scheduler.FactorScheduler(args.lr_factor_step, 0.5,
                                                                 base_lr=args.lr)
    if args.gluoncv_warmup_steps:
        params["lr_scheduler"] = gluoncv_schedule(args.lr, args.gluoncv_warmup_steps, args.steps)
    return params


def slow_down(args, kv, step):
    """--slow-rank sleeps before every other step: the other workers run ahead meanwhile,
    and their pushes of the next step must wait for this worker's round (the servers merge
    pushes by count, not by round)."""
    if kv.rank == args.slow_rank and step % 2:
        mx.nd.waitall()
        time.sleep(args.slow_seconds)


def run_gluon(args, kv):
    contexts = [mx.cpu(i) for i in range(args.devices)]
    net = mx.gluon.nn.Dense(problem.OUT_UNITS, in_units=problem.IN_UNITS)
    net.initialize(ctx=contexts)
    weight, bias = problem.initial_weights()
    net.weight.set_data(mx.nd.array(weight))
    net.bias.set_data(mx.nd.array(bias))
    net.weight.lr_mult = args.lr_mult_weight
    net.bias.wd_mult = args.wd_mult_bias
    if args.freeze_bias_steps:
        net.bias.grad_req = "null"
    trainer = mx.gluon.Trainer(net.collect_params(), args.optimizer, optimizer_params(args),
                               kvstore=args.kvstore if kv is None else kv)
    if kv is None:   # --store-by-name: the Trainer makes the store; its rank picks the data
        # made before the first step here: with the rescale_grad that step(BATCH) sets
        trainer._optimizer.rescale_grad = trainer._scale / problem.BATCH
        trainer._init_kvstore()
        kv = trainer._kvstore
    run_gluon.store = kv
    if args.resume_prefix:
        odsgd.load_checkpoint(trainer, args.resume_prefix)
    local_w, local_b, lrs = [], [], []
    global_steps = {"weight": [], "bias": []}
    for step in range(args.first_step, args.steps):
        if step == args.lr_change_step:
            trainer.set_learning_rate(args.lr_change_to)
        if step == args.lr_mult_change_step:
            net.weight.lr_mult = args.lr_mult_change_to
        if args.freeze_bias_steps and step == args.freeze_bias_steps:
            net.bias.grad_req = "write"
        if args.epoch_every and step and step % args.epoch_every == 0:
            assert odsgd.equal_steps(trainer, args.steps) == args.steps
        slow_down(args, kv, step)
        X, Y = problem.batch(kv.rank, step)
        xs = np.array_split(X, len(contexts))
        ys = np.array_split(Y, len(contexts))
        with mx.autograd.record():
            losses = [0.5 * ((net(mx.nd.array(x, ctx=c)) - mx.nd.array(y, ctx=c)) ** 2).sum()
                      for x, y, c in zip(xs, ys, contexts)]
        mx.autograd.backward(losses)
        trainer.step(problem.BATCH)
        local_w.append(net.weight.data(contexts[-1]).asnumpy())
        local_b.append(net.bias.data(contexts[-1]).asnumpy())
        lrs.append(trainer.learning_rate)
        if args.record_global:
            mx.nd.waitall()   # this worker's push completed: its round is applied
            for i, param in enumerate(trainer._params):
                out = mx.nd.zeros(param.shape)
                trainer._kvstore.pull(i, out=out)
                global_steps[param.name.rsplit("_", 1)[-1]].append(out.asnumpy())
    run_gluon.global_steps = global_steps
    if args.save_prefix:
        odsgd.save_checkpoint(trainer, args.save_prefix)
    # The newest global weights: W_T, after every worker's last push.
    if args.kvstore == "dist_odsgd":
        odsgd.load_global_weights(trainer)
    else:
        for i, param in enumerate(trainer._params):
            kv.pull(i, out=param.list_data())
    return (np.array(local_w), np.array(local_b), net.weight.data().asnumpy(),
            net.bias.data().asnumpy(), np.array(lrs))


def run_module(args, kv):
    data = mx.sym.var("data")
    label = mx.sym.var("label")
    fc_weight = mx.sym.var("fc_weight", lr_mult=args.lr_mult_weight)
    out = mx.sym.FullyConnected(data, weight=fc_weight, num_hidden=problem.OUT_UNITS, name="fc")
    loss = mx.sym.MakeLoss(0.5 * mx.sym.sum(mx.sym.square(out - label)))
    X = np.concatenate([problem.batch(kv.rank, t)[0] for t in range(args.steps)])
    Y = np.concatenate([problem.batch(kv.rank, t)[1] for t in range(args.steps)])
    train = mx.io.NDArrayIter(X, Y, batch_size=problem.BATCH, shuffle=False,
                              label_name="label")
    mod = mx.mod.Module(loss, data_names=["data"], label_names=["label"],
                        context=[mx.cpu(i) for i in range(args.devices)])
    weight, bias = problem.initial_weights()
    local_w, local_b = [], []

    def record(_param):
        # the worker's own weights w_t, as the executor holds them (get_params shows the
        # global model under the default ODSGD_EVAL_WEIGHTS=global, odsgd/worker/eval_weights.py)
        arrays = dict(zip(mod._exec_group.param_names, mod._exec_group.param_arrays))
        local_w.append(arrays["fc_weight"][-1].asnumpy())
        local_b.append(arrays["fc_bias"][-1].asnumpy())

    mod.fit(train, num_epoch=1, kvstore=kv, optimizer=args.optimizer,
            eval_metric=mx.metric.Loss(),
            optimizer_params=optimizer_params(args),
            arg_params={"fc_weight": mx.nd.array(weight), "fc_bias": mx.nd.array(bias)},
            batch_end_callback=record)
    if args.kvstore == "dist_odsgd":
        odsgd.load_global_weights(mod)
    else:
        for name, arrays in zip(mod._exec_group.param_names, mod._exec_group.param_arrays):
            kv.pull(name, out=arrays)
    arg_params, _ = mod.get_params()
    return (np.array(local_w), np.array(local_b), arg_params["fc_weight"].asnumpy(),
            arg_params["fc_bias"].asnumpy(), np.zeros(0))


def run_store(args, kv):
    """The store's own API, as a user without Trainer or Module: kv.init with this worker's
    values (rank 0's must become W_0 everywhere), kv.pull, one pushpull of both keys a step."""
    optimizer = mx.optimizer.create(args.optimizer, rescale_grad=1.0 / problem.BATCH,
                                    multi_precision=args.dtype != "float32",
                                    **optimizer_params(args))
    kv.set_optimizer(optimizer)
    weight, bias = problem.initial_weights()
    offset = kv.rank * args.rank_init_offset
    dtype = args.dtype
    kv.init([0, 1], [mx.nd.array(weight + offset, dtype=dtype),
                     mx.nd.array(bias + offset, dtype=dtype)])
    arrays = [mx.nd.zeros(weight.shape, dtype=dtype), mx.nd.zeros(bias.shape, dtype=dtype)]
    kv.pull([0, 1], out=arrays)
    local_w, local_b = [], []
    for step in range(args.steps):
        slow_down(args, kv, step)
        X, Y = problem.batch(kv.rank, step)
        grads = problem.gradients(arrays[0].asnumpy().astype(np.float32),
                                  arrays[1].asnumpy().astype(np.float32), X, Y)
        kv.pushpull([0, 1], [mx.nd.array(g, dtype=dtype) for g in grads], out=arrays)
        local_w.append(arrays[0].asnumpy().astype(np.float32))
        local_b.append(arrays[1].asnumpy().astype(np.float32))
    kv.pull([0, 1], out=arrays)
    return (np.array(local_w), np.array(local_b), arrays[0].asnumpy().astype(np.float32),
            arrays[1].asnumpy().astype(np.float32), np.zeros(0))


def main():
    args = parse_args()
    by_name = args.api == "gluon" and args.store_by_name
    kv = None if by_name else make_store(args)
    run = {"gluon": run_gluon, "module": run_module, "store": run_store}[args.api]
    local_w, local_b, global_w, global_b, lrs = run(args, kv)
    steps = getattr(run, "global_steps", {"weight": [], "bias": []})
    if by_name:
        kv = run.store
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), local_weight=local_w,
             local_bias=local_b, global_weight=global_w, global_bias=global_b,
             learning_rates=lrs, num_workers=kv.num_workers, type=str(kv.type),
             predict_estimate=getattr(getattr(kv, "config", None), "predict_estimate", ""),
             global_weight_steps=np.array(steps["weight"]),
             global_bias_steps=np.array(steps["bias"]))


if __name__ == "__main__":
    main()
