"""Benchmarks of the fused OD-SGD local update on its own.

    python scripts/bench_local_update.py dispatch --json runs/bench_dispatch.json
    python scripts/bench_local_update.py bandwidth --json runs/bench_local_update.json
    python scripts/bench_local_update.py step --json runs/bench_step.json

dispatch: the per-step cost of a group of P parameter arrays, P one-array calls
(odsgd.native.multi_update_ with P = 1 on the array's own 1-D states, as a store working per
key would) against one multi-array call, for P = 1, 16 and 162 arrays of a Dense(16) net
(16x16 weights and 16 biases) and for ResNet-50 v1's 161 parameter shapes. "issue" is the
Python time until the calls return (what the training loop's thread pays), "total" until
MXNet's engine has run them (mx.nd.waitall), each call starting on idle arrays as in a
training step. Per-array time = total / P.

bandwidth: for each array size and compensation mode it times three things and reports memory
bandwidth:

  fused     odsgd.native.multi_update_('sgd', [weight], ...): the operator on one array
            (P = 1; the arrays are 1-D, so they are their own flat states), one pass: reads
            local_flat (w_t), grad, global_weight, mom (+ var when adaptive), writes weight,
            local_flat, mom (+ var): 28 (36) bytes per element.
  copy      NDArray.copyto of an array holding the same number of bytes (read + write): the
            memory-bandwidth reference, what one pass over that much memory costs.
  fallback  the same math as plain mx.nd operators: the package's own NDArray fallback,
            odsgd.worker.local_update.ndarray_local_update_.

Bandwidth = the fused operator's byte count / time, for all three, so that "fused / copy" is
the fraction of copy bandwidth the fused operator reaches and "speed-up" = fallback time /
fused time. Targets: fused >= 0.8x copy, >= 2x faster than the fallback.

step: a whole model's local update as the store makes it every step (LocalUpdater.update_group
on the key groups the store packs the parameters into): local 'sgd' with lam = 0 and with the
adaptive compensation (lam = 2), 'predict' for a global SGD (the fused kernel) and for a global
Adam (the optimizer's own update per parameter), for ResNet-18 v2's 62 parameter arrays (11.7 M elements, many small,
a few large) and the 2.1 M-parameter benchmark MLP: steps in a row with no wait in between,
as a training loop makes them. "issue" is the Python time per step (what the training
loop's thread pays, waits included), "total" the time per step until MXNet's engine has run
them all, "wait" the part of issue spent in odsgd.native.layout.to_default_layout (the
blocking wait for the weights' pending writes). It uses only LocalUpdater and KeyGroup, so it
runs on any version of the package (to compare one with another).

Threads: MXNet runs CPU operators with its own OpenMP thread count (OMP_NUM_THREADS, else
MXNET_OMP_MAX_THREADS, else half the logical CPUs on x86); this script sets neither and
records both in the JSON.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mxnet as mx  # noqa: E402

from odsgd import native  # noqa: E402
from odsgd.worker.local_update import ndarray_local_update_  # noqa: E402

MiB_ELEMENTS = 1 << 20
HYPER = dict(rescale_grad=1.0 / 256, clip_gradient=None, lr=0.05, momentum=0.9, wd=1e-4,
             lam=0.04, beta=0.95, eps=1e-7)


def bytes_per_call(n, adaptive):
    """Bytes the fused operator must move: 4 arrays read and 3 written (constant mode),
    5 read and 4 written (adaptive), 4 bytes per float32 element."""
    arrays = 9 if adaptive else 7
    return arrays * 4 * n


def time_interleaved(calls, repeats, min_time):
    """Seconds per call of each function in `calls` (name -> function): median, min, max over
    `repeats` timed runs. The runs of the different functions alternate (a, b, c, a, b, c,
    ...) so that load from other processes falls on all of them alike. Each run makes `iters`
    calls, chosen from a warm-up call so that a run lasts about `min_time` seconds;
    mx.nd.waitall() brackets every run because MXNet's operators run asynchronously."""
    iters, samples = {}, {name: [] for name in calls}
    for name, call in calls.items():
        mx.nd.waitall()
        start = time.perf_counter()
        call()
        mx.nd.waitall()
        iters[name] = max(1, int(min_time / max(time.perf_counter() - start, 1e-6)))
    for _ in range(repeats):
        for name, call in calls.items():
            mx.nd.waitall()
            start = time.perf_counter()
            for _ in range(iters[name]):
                call()
            mx.nd.waitall()
            samples[name].append((time.perf_counter() - start) / iters[name])
    return {name: {"median_s": statistics.median(per_call), "min_s": min(per_call),
                   "max_s": max(per_call), "iters": iters[name], "repeats": repeats}
            for name, per_call in samples.items()}


def fused_update(weight, grad, global_weight, mom, var, local, *, adaptive, rescale_grad,
                 clip_gradient, lr, momentum, wd, lam, beta, eps):
    """The fused local update of one array: the operator with P = 1, w_t read from `local`
    (the store's flat copy of the weights), w_{t+1} written to weight and local. All arrays
    are 1-D (or weight and grad any shape, the others 1-D of their size); var may be None
    unless adaptive."""
    native.multi_update_("sgd", [weight], [grad], global_weight, mom_flat=mom, var_flat=var,
                         local_flat=local, lrs=[lr], wds=[wd], rescale_grad=rescale_grad,
                         clip_gradient=clip_gradient, momentum=momentum, lam=lam,
                         adaptive=adaptive, beta=beta, eps=eps)


def make_state(n, seed):
    """weight, grad, global_weight, mom, var, local (= weight): float32 arrays of n elements."""
    mx.random.seed(seed)
    global_weight = mx.nd.random.normal(0, 1, shape=(n,), dtype="float32")
    weight = global_weight + mx.nd.random.normal(0, 0.01, shape=(n,), dtype="float32")
    grad = mx.nd.random.normal(0, 1, shape=(n,), dtype="float32")
    return weight, grad, global_weight, mx.nd.zeros((n,)), mx.nd.zeros((n,)), weight.copy()


def check_agreement(adaptive):
    """The two implementations must compute the same thing before their times compare."""
    fused = make_state(10007, seed=1)
    fallback = [a.copy() for a in fused[:5]]
    for _ in range(3):
        fused_update(*fused, adaptive=adaptive, **HYPER)
        ndarray_local_update_(*fallback, adaptive=adaptive, **HYPER)
    for name, a, b in zip(("weight", "mom", "var"), (fused[0], fused[3], fused[4]),
                          (fallback[0], fallback[3], fallback[4])):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6,
                                   err_msg="fused and fallback disagree on " + name)


def bench_one(n, adaptive, repeats, min_time):
    nbytes = bytes_per_call(n, adaptive)
    fused_state = make_state(n, seed=n)
    fallback_state = [a.copy() for a in fused_state[:5]]
    src = mx.nd.ones((nbytes // 8,))       # copy reads and writes 4 bytes per element
    dst = mx.nd.zeros((nbytes // 8,))
    timings = time_interleaved({
        "fused": lambda: fused_update(*fused_state, adaptive=adaptive, **HYPER),
        "copy": lambda: src.copyto(dst),
        "fallback": lambda: ndarray_local_update_(*fallback_state, adaptive=adaptive, **HYPER),
    }, repeats, min_time)
    mx.nd.waitall()     # the arrays are freed when this function returns
    row = {"elements": n, "mode": "adaptive" if adaptive else "constant",
           "bytes_per_call": nbytes}
    for name, timing in timings.items():
        row[name] = dict(timing, **{key.replace("_s", "_gbps"): nbytes / timing[key] / 1e9
                                    for key in ("median_s", "min_s", "max_s")})
    fused, copy, fallback = timings["fused"], timings["copy"], timings["fallback"]
    # Ratios of medians, and of the fastest runs (the least disturbed by other processes).
    row["fused_over_copy"] = copy["median_s"] / fused["median_s"]
    row["speedup_over_fallback"] = fallback["median_s"] / fused["median_s"]
    row["fused_over_copy_best"] = copy["min_s"] / fused["min_s"]
    row["speedup_over_fallback_best"] = fallback["min_s"] / fused["min_s"]
    return row


def gbps_cell(timing):
    # Bandwidth from the slowest and fastest run: max time gives the lower bound.
    return "%5.1f [%4.1f-%4.1f]" % (timing["median_gbps"], timing["max_gbps"],
                                    timing["min_gbps"])


def print_table(rows):
    header = ("%8s %-8s %7s  %-18s %-18s %-18s %-14s %-14s"
              % ("elements", "mode", "MB/call", "fused GB/s", "copy GB/s", "fallback GB/s",
                 "fused/copy", "speed-up"))
    print(header)
    print("-" * len(header))
    for row in rows:
        print("%7dM %-8s %7.0f  %-18s %-18s %-18s %-14s %-14s"
              % (row["elements"] // MiB_ELEMENTS, row["mode"], row["bytes_per_call"] / 1e6,
                 gbps_cell(row["fused"]), gbps_cell(row["copy"]), gbps_cell(row["fallback"]),
                 "%.2fx (%.2fx)" % (row["fused_over_copy"], row["fused_over_copy_best"]),
                 "%.1fx (%.1fx)" % (row["speedup_over_fallback"],
                                    row["speedup_over_fallback_best"])))
    print("GB/s: median [slowest run - fastest run] of the repeats; ratios: of medians "
          "(of fastest runs); 1 GB = 1e9 bytes; M = 2^20 elements")


def dense16_shapes(num_arrays):
    """Shapes of the first `num_arrays` parameters of a stack of Dense(16, in_units=16)."""
    return [(16, 16) if k % 2 == 0 else (16,) for k in range(num_arrays)]


def resnet50_shapes():
    """ResNet-50 v1's parameter shapes (161 arrays with grad_req != 'null'), in Trainer
    order (sorted by name), from MXNet's model zoo after a forward on 32x32 inputs."""
    net = mx.gluon.model_zoo.vision.resnet50_v1()
    net.initialize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    params = net.collect_params()
    return [params[name].shape for name in sorted(params)
            if params[name].grad_req != "null"]


def dispatch_calls(shapes, seed):
    """(single, multi): functions making one step over arrays of `shapes` the per-array way
    and the multi-array way, each on its own copy of the same state."""
    rng = np.random.default_rng(seed)
    total = sum(int(np.prod(s)) for s in shapes)

    def state():
        weights = [mx.nd.array(rng.standard_normal(s), dtype="float32") for s in shapes]
        grads = [mx.nd.array(rng.standard_normal(s), dtype="float32") for s in shapes]
        return weights, grads

    weights, grads = state()
    globals_ = [w.reshape((-1,)).copy() for w in weights]
    moms = [mx.nd.zeros((int(np.prod(s)),)) for s in shapes]
    locals_ = [w.reshape((-1,)).copy() for w in weights]
    m_weights, m_grads = state()
    global_flat = mx.nd.array(rng.standard_normal(total), dtype="float32")
    mom_flat = mx.nd.zeros((total,))
    local_flat = mx.nd.array(np.concatenate([w.asnumpy().ravel() for w in m_weights]))
    lrs, wds = [0.05] * len(shapes), [1e-4] * len(shapes)
    common = {k: v for k, v in HYPER.items() if k not in ("lr", "wd")}

    def single():
        for k in range(len(shapes)):
            fused_update(weights[k], grads[k], globals_[k], moms[k], None, locals_[k],
                         adaptive=False, lr=0.05, wd=1e-4, **common)

    def multi():
        native.multi_update_("sgd", m_weights, m_grads, global_flat, mom_flat=mom_flat,
                             local_flat=local_flat, lrs=lrs, wds=wds, adaptive=False,
                             **common)

    return single, multi


def time_dispatch(call, repeats, min_time):
    """(issue seconds, total seconds) of one call on idle arrays, as in a training step,
    where the arrays were last written a whole forward/backward ago: every call starts
    after mx.nd.waitall(); issue is measured when it returns, total after the next waitall.
    Medians over `repeats` runs of calls lasting about `min_time` seconds each."""
    mx.nd.waitall()
    start = time.perf_counter()
    call()
    mx.nd.waitall()
    iters = max(1, int(min_time / max(time.perf_counter() - start, 1e-6)))
    issue, total = [], []
    for _ in range(repeats * iters):
        mx.nd.waitall()
        start = time.perf_counter()
        call()
        issued = time.perf_counter()
        mx.nd.waitall()
        issue.append(issued - start)
        total.append(time.perf_counter() - start)
    return {"issue_s": statistics.median(issue), "total_s": statistics.median(total),
            "total_min_s": min(total), "total_max_s": max(total), "iters": iters}


def bench_dispatch(args):
    groups = [("dense16 x%d" % p, dense16_shapes(p)) for p in (1, 16, 162)]
    groups.append(("resnet50_v1", resnet50_shapes()))
    rows = []
    for name, shapes in groups:
        single, multi = dispatch_calls(shapes, seed=len(shapes))
        # Interleaved so that load from other processes falls on both alike.
        samples = {"single": [], "multi": []}
        for _ in range(args.repeats):
            samples["single"].append(time_dispatch(single, 1, args.min_time))
            samples["multi"].append(time_dispatch(multi, 1, args.min_time))
        row = {"group": name, "arrays": len(shapes),
               "elements": int(sum(int(np.prod(s)) for s in shapes))}
        for how, runs in samples.items():
            row[how] = {key: statistics.median(r[key] for r in runs)
                        for key in ("issue_s", "total_s")}
            row[how]["total_min_s"] = min(r["total_s"] for r in runs)
            row[how]["total_max_s"] = max(r["total_s"] for r in runs)
        row["speedup"] = row["single"]["total_s"] / row["multi"]["total_s"]
        rows.append(row)
        print("  measured %s" % name, file=sys.stderr, flush=True)
    header = ("%-13s %6s %9s  %-26s %-26s %8s" % ("group", "arrays", "elements",
                                                   "P single calls: issue/total",
                                                   "one multi call: issue/total", "speed-up"))
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = []
        for how in ("single", "multi"):
            r = row[how]
            cells.append("%7.1f / %7.1f us" % (1e6 * r["issue_s"], 1e6 * r["total_s"]))
        print("%-13s %6d %9d  %-26s %-26s %7.1fx" % (row["group"], row["arrays"],
                                                      row["elements"], cells[0], cells[1],
                                                      row["speedup"]))
    print("us per step for the whole group, medians of %d interleaved repeats; issue = until "
          "the calls return, total = until MXNet ran them" % args.repeats)
    return rows


def bench_bandwidth(args):
    sizes = [int(s) * MiB_ELEMENTS for s in args.sizes.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    for mode in modes:
        if mode not in ("constant", "adaptive"):
            sys.exit("bench_local_update: unknown mode %r" % mode)
        check_agreement(mode == "adaptive")
    rows = []
    for n in sizes:
        for mode in modes:
            rows.append(bench_one(n, mode == "adaptive", args.repeats, args.min_time))
            print("  measured %dM %s" % (n // MiB_ELEMENTS, mode), file=sys.stderr, flush=True)
    print_table(rows)
    return rows


# -- step: a whole model's local update, lam = 0 against the compensation ----------------------
#: setting -> (local optimizer, global optimizer, lam, compensation mode)
STEP_SETTINGS = {"lam=0": ("sgd", "sgd", 0.0, "constant"),
                 "lam=2 adaptive": ("sgd", "sgd", 2.0, "adaptive"),
                 "predict sgd": ("predict", "sgd", 0.0, "constant"),
                 "predict adam": ("predict", "adam", 0.0, "constant")}


def mlp_shapes():
    """The 2.1 M-parameter benchmark MLP (odsgd/bench/throughput_job.py, 1024-1024-1024-10) in
    gluon.Trainer's order (parameters sorted by name)."""
    return [(1024,), (1024, 1024), (1024,), (1024, 1024), (10,), (10, 1024)]


def step_models():
    from odsgd.bench.model_shapes import model_shapes
    return {"resnet18_v2": list(model_shapes("resnet18_v2")), "mlp": mlp_shapes()}


def step_groups(shapes, seed):
    """[(KeyGroup, weights, grads)]: the key groups the store packs these parameters into
    (plan_fusion with the default ODSGD_FUSION_ELEMENTS), W_t and W_{t-1} near the weights."""
    from odsgd.common.config import DEFAULT_FUSION_ELEMENTS
    from odsgd.worker.key_groups import KeyGroup
    from odsgd.worker.key_plan import plan_fusion
    rng = np.random.default_rng(seed)
    sizes = [int(np.prod(s)) for s in shapes]
    groups = []
    for number, members in enumerate(plan_fusion(sizes, [("float32", "cpu")] * len(sizes),
                                                 DEFAULT_FUSION_ELEMENTS)):
        values = [(0.1 * rng.standard_normal(shapes[p])).astype(np.float32) for p in members]
        weights = [mx.nd.array(v, dtype="float32") for v in values]
        grads = [mx.nd.array(rng.standard_normal(shapes[p]), dtype="float32") for p in members]
        group = KeyGroup(number, members, members, weights)
        flat = np.concatenate([v.ravel() for v in values])
        for buffer in (group.current, group.previous):
            buffer[:] = flat + (0.01 * rng.standard_normal(flat.size)).astype(np.float32)
        groups.append((group, weights, grads))
    return groups


def step_updater(local, global_optimizer, lam, mode):
    """The local rule of a store with this local optimizer ('sgd': its own rates; 'predict':
    the global optimizer's) and compensation, for this global optimizer."""
    from odsgd.worker.config import ODSGDConfig
    from odsgd.worker.local_update import LocalUpdater
    params = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4} if local == "sgd" else None
    config = ODSGDConfig(local_optimizer=local, local_optimizer_params=params,
                         compensation=lam, compensation_mode=mode, warmup_steps=0, environ={})
    momentum = {"momentum": 0.9} if global_optimizer == "sgd" else {}
    optimizer = mx.optimizer.create(global_optimizer, learning_rate=0.01, wd=1e-4,
                                    rescale_grad=1.0 / 128, **momentum)
    return LocalUpdater(config, optimizer, num_workers=2)


class WaitMeter(object):
    """Seconds the Python thread spends in odsgd.native.layout.to_default_layout (the
    blocking wait for the weights' pending writes), wherever the package calls it."""

    def __init__(self):
        from odsgd.native import layout
        self.seconds, self.calls = 0.0, 0
        original = layout.to_default_layout

        def timed(arrays, context):
            start = time.perf_counter()
            try:
                return original(arrays, context)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        layout.to_default_layout = timed


def run_steps(updater, groups, first_step, steps, meter):
    """(issue, total, wait) seconds per step of `steps` local updates of every group in a
    row, without a wait in between, as a training loop makes them."""
    multipliers = {id(g): [(1.0, 1.0)] * len(w) for g, w, _ in groups}
    mx.nd.waitall()
    waited = meter.seconds
    start = time.perf_counter()
    for step in range(first_step, first_step + steps):
        for group, weights, grads in groups:
            updater.update_group(group, step, weights, grads, multipliers[id(group)])
    issued = time.perf_counter()
    mx.nd.waitall()
    total = time.perf_counter() - start
    return (issued - start) / steps, total / steps, (meter.seconds - waited) / steps


def step_cases(args):
    """{(model, setting): [updater, groups, next step, steps per run]}, warmed up."""
    models = step_models()
    cases = {}
    for model in args.models.split(","):
        for setting in args.settings.split(";"):
            updater = step_updater(*STEP_SETTINGS[setting])
            groups = step_groups(models[model], seed=len(models[model]))
            mx.nd.waitall()
            start = time.perf_counter()
            run_steps(updater, groups, 0, 2, WaitMeter.active)
            per_step = (time.perf_counter() - start) / 2
            cases[(model, setting)] = [updater, groups, 2,
                                       max(3, int(args.min_time / max(per_step, 1e-6)))]
    return cases


def bench_step(args):
    WaitMeter.active = WaitMeter()
    cases = step_cases(args)
    samples = {case: [] for case in cases}
    for _ in range(args.repeats):         # interleaved: load falls on every case alike
        for case, state in cases.items():
            updater, groups, first, steps = state
            samples[case].append(run_steps(updater, groups, first, steps, WaitMeter.active))
            state[2] += steps
    rows = []
    for (model, setting), runs in samples.items():
        row = {"model": model, "setting": setting, "steps_per_run": cases[(model, setting)][3],
               "groups": len(cases[(model, setting)][1]), "repeats": len(runs),
               "runs_s": [dict(zip(("issue", "total", "wait"), run)) for run in runs]}
        for position, name in enumerate(("issue", "total", "wait")):
            values = [run[position] for run in runs]
            row[name] = {"median_s": statistics.median(values), "min_s": min(values),
                         "max_s": max(values)}
        rows.append(row)
    print_step_table(rows)
    return rows


def print_step_table(rows):
    header = "%-12s %-15s %6s  %-24s %-24s %-24s" % ("model", "setting", "groups",
                                                   "total ms/step", "issue ms/step",
                                                   "wait ms/step")

    def cell(timing):
        return "%7.2f [%6.2f-%6.2f]" % (1e3 * timing["median_s"], 1e3 * timing["min_s"],
                                        1e3 * timing["max_s"])
    print(header)
    print("-" * len(header))
    for row in rows:
        print("%-12s %-15s %6d  %-24s %-24s %-24s" % (row["model"], row["setting"],
                                                       row["groups"], cell(row["total"]),
                                                       cell(row["issue"]), cell(row["wait"])))
    print("median [fastest - slowest] of the interleaved runs; total: until MXNet ran them, "
          "issue: the Python thread, wait: of issue, in to_default_layout")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmark", choices=("dispatch", "bandwidth", "step"), nargs="?",
                        default="dispatch", help="what to measure (default: dispatch)")
    parser.add_argument("--sizes", default="1,4,16,64",
                        help="bandwidth: array sizes in units of 2^20 float32 elements "
                             "(default: 1,4,16,64)")
    parser.add_argument("--modes", default="constant,adaptive",
                        help="bandwidth: compensation modes to time (default: constant,adaptive)")
    parser.add_argument("--models", default="resnet18_v2,mlp",
                        help="step: the models (default: resnet18_v2,mlp)")
    parser.add_argument("--settings", default=";".join(STEP_SETTINGS),
                        help="step: ';'-separated settings of %s" % sorted(STEP_SETTINGS))
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per cell (default 5)")
    parser.add_argument("--min-time", type=float, default=0.25,
                        help="seconds one timed run should last at least (default 0.25)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not native.load():
        sys.exit("bench_local_update: the fused operator is not built; run `make native` or "
                 "`python -m odsgd.native build` first")
    rows = {"dispatch": bench_dispatch, "bandwidth": bench_bandwidth,
            "step": bench_step}[args.benchmark](args)
    if args.json:
        meta = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                "benchmark": args.benchmark,
                "mxnet_version": mx.__version__, "build_info": native.build_info(),
                "cpu": platform.processor() or platform.machine(),
                "logical_cpus": os.cpu_count(),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                "MXNET_OMP_MAX_THREADS": os.environ.get("MXNET_OMP_MAX_THREADS"),
                "hyper_parameters": HYPER,
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        folder = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(folder, exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=2)
            handle.write("\n")
        print("wrote " + args.json)


if __name__ == "__main__":
    main()
