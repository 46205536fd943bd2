"""`python -m odsgd.native check-gpu`: the CUDA kernels on this machine's GPU, without MXNet.

    python -m odsgd.native check-gpu [--nvcc PATH] [--repeats N] [--quiet]

Compiles kvstore_ext/local_update_op_gpu.cu with the standalone driver
kvstore_ext/gpu_check_driver.cu (for the GPU's own architecture), then

1. runs every kind of call (sgd, predict, nag_predict with clip and adaptive on and off and
   with w_t in local_flat (lam 0.5) or without it (lam 0), the predicts with and without the
   previous round's sum in their estimate; gather; scatter) on groups of arrays that include
   empty ones, tile boundaries and a single array, with the updates' weights NaN before the
   call (they are outputs only: one read would show), and compares every array the driver
   hands back
   with the NumPy float32 reference below (docs/spec.md, section 4): the updated ones to rtol 1e-5
   / atol 1e-6 (as tests/test_fused_op.py; nvcc contracts a * b + c into FMAs), copies and
   every array the call must leave alone exactly;
2. times the kernels on ResNet-50 v1's 161 parameter arrays (25.6 M elements) and on one
   array of the same size, against a device-to-device copy and the single-array
   grid-stride kernel this operator family replaced, and prints their bandwidth.

It needs a GPU, its driver and an nvcc (the one `make cuda-check` installs into .venv/cuda
will do), not a CUDA build of MXNet. Without a GPU or an nvcc it prints one line saying why
and exits 0; a wrong result exits 1. No mxnet import.
"""
import glob
import itertools
import os
import re
import shutil
import subprocess
import tempfile

from .build import NativeBuildError, build_gpu_check_driver
from .library import SOURCE_DIR

REPO_ROOT = os.path.dirname(SOURCE_DIR)
PREFIX = "odsgd.native check-gpu: "
RTOL, ATOL = 1e-5, 1e-6
SLOTS = ("weight", "grad", "global", "aux", "var", "est", "local", "flat")   # driver's order
UPDATE_KINDS = ("sgd", "predict", "nag_predict")
# Array sizes of the correctness cases: one array of several tiles (1024 elements each) and a
# partial one; a mix with empty arrays, single elements and tile boundaries; nothing at all.
GROUPS = {"one": [10007], "mixed": [3, 0, 20001, 1, 2048, 0, 1025, 1024], "empty": [0, 0]}
HYPER = dict(rescale_grad=0.5, momentum=0.9, lam=0.5, beta=0.9, eps=1e-7)   # lam with local
PREDICT_KINDS = ("predict", "nag_predict")
CLIP = 0.8


def _say(line):
    print(PREFIX + line, flush=True)


# ------------------------------------------------------------------------------------------
# What this machine has

def find_gpu():
    """({'name', 'arch', 'driver'}, None) of the first GPU nvidia-smi lists, or (None, why).
    arch is the compute capability as an int (90 for 9.0), None where nvidia-smi is too old
    to report it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "nvidia-smi is not on PATH"
    for fields in ("name,driver_version,compute_cap", "name,driver_version"):
        try:
            result = subprocess.run([smi, "--query-gpu=" + fields, "--format=csv,noheader"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    universal_newlines=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, "nvidia-smi failed: %s" % err
        if result.returncode == 0:
            break
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0:
        return None, "nvidia-smi failed: %s" % (lines[0] if lines else result.returncode)
    if not lines:
        return None, "nvidia-smi lists no GPU"
    parts = [part.strip() for part in lines[0].split(",")]
    cap = re.fullmatch(r"(\d+)\.(\d+)", parts[2]) if len(parts) > 2 else None
    return {"name": parts[0], "driver": parts[1] if len(parts) > 1 else "?",
            "arch": int(cap.group(1)) * 10 + int(cap.group(2)) if cap else None}, None


def find_nvcc(given=None):
    """(path, None) of the nvcc to use: `given`, else .venv/cuda's (what `make cuda-check`
    installs), else nvcc on PATH, else /usr/local/cuda/bin/nvcc; or (None, why)."""
    if given:
        path = shutil.which(given)
        return (path, None) if path else (None, "--nvcc %s is not an executable" % given)
    installed = sorted(glob.glob(os.path.join(REPO_ROOT, ".venv", "cuda", "nvidia", "cu*",
                                              "bin", "nvcc")))
    for candidate in installed[::-1] + [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate, None
    return None, ("none in .venv/cuda (`make cuda-check` installs one), on PATH or in "
                  "/usr/local/cuda/bin; pass --nvcc")


def _driver_archs(nvcc, gpu):
    """[the GPU's architecture] when this nvcc compiles for it and ODSGD_CUDA_ARCH is unset;
    else None: the build's own choice (which ends with PTX that newer GPUs compile)."""
    if os.environ.get("ODSGD_CUDA_ARCH") or gpu["arch"] is None:
        return None
    listed = subprocess.run([nvcc, "--list-gpu-arch"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, universal_newlines=True).stdout
    return [gpu["arch"]] if "compute_%d" % gpu["arch"] in listed.split() else None


# ------------------------------------------------------------------------------------------
# The NumPy reference (docs/spec.md, section 4, float32, in the formulas' order)

def reference(case, arrays):
    """The 8 arrays (SLOTS) as the call of `case` must leave them, from `arrays`, theirs
    before it; the per-array lists (lr, wd, prev_decay, own_scale, prev_scale) are spread
    over each array's elements. The updates read w_t from `local` (lam 0.5) or not at all
    (lam 0: W stands in), never from `weight`."""
    import numpy as np
    f32 = np.float32
    out = {name: arrays[name].copy() for name in SLOTS}
    kind = case["kind"]
    if kind == "gather":
        out["flat"] = arrays["weight"].copy()
        return out
    if kind == "scatter":
        out["weight"] = arrays["flat"].copy()
        return out
    sizes = case["sizes"]
    lr, wd, decay, own, prev = (np.repeat(np.asarray(case[key], f32), sizes) for key in
                                ("lrs", "wds", "prev_decays", "own_scales", "prev_scales"))
    grad, W, aux = arrays["grad"], arrays["global"], arrays["aux"]
    w = arrays["local"] if case["local"] else W
    g = f32(HYPER["rescale_grad"]) * grad
    if case["clip"]:
        g = np.clip(g, -f32(CLIP), f32(CLIP))
    c = f32(1)
    if case["adaptive"]:
        out["var"] = f32(HYPER["beta"]) * arrays["var"] + f32(1.0 - HYPER["beta"]) * g * g
        c = f32(1) / np.sqrt(out["var"] + f32(HYPER["eps"]))
    compensation = f32(lam_of(case)) * c * g * g * (W - w)
    gc = g + compensation
    mu, delta = f32(HYPER["momentum"]), W - aux
    if kind == "sgd":
        out["aux"] = mu * aux - lr * (g + wd * W + compensation)
        out["weight"] = W + out["aux"]
    elif kind == "predict":
        out["weight"] = W + mu * delta - lr * (own * gc + wd * W)
        if case["previous"]:   # the servers' previous round from their momentum, est
            out["est"] = delta
            out["weight"] = out["weight"] - prev * (mu * arrays["est"] - delta - decay * aux)
    else:
        one_plus_mu = mu + f32(1)
        out["est"] = (delta + mu * arrays["est"]) / one_plus_mu - decay * delta
        a = mu * out["est"]
        bracket = a - lr * (own * gc + wd * W)
        if case["previous"]:   # the servers' previous round from the estimate's update
            bracket = bracket - prev * (mu * arrays["est"] - out["est"] - decay * W)
        out["weight"] = (W - a) + one_plus_mu * bracket
    if case["local"]:
        out["local"] = out["weight"].copy()
    return out


def lam_of(case):
    """The compensation strength of an update case: HYPER's with w_t in local, else 0 (the
    operator refuses lam != 0 without local_flat)."""
    return HYPER["lam"] if case["local"] else 0.0


def _computed(case):
    """The arrays the call of `case` computes (compared to rounding); every other one is
    either copied or left alone, and compared exactly."""
    if case["kind"] not in UPDATE_KINDS:
        return ()
    uses_est = case["kind"] == "nag_predict" or (case["kind"] == "predict" and case["previous"])
    return (("weight",) + (("aux",) if case["kind"] == "sgd" else ())
            + (("var",) if case["adaptive"] else ()) + (("est",) if uses_est else ())
            + (("local",) if case["local"] else ()))


# ------------------------------------------------------------------------------------------
# Correctness cases

def correctness_cases():
    """Every update kind x clip x adaptive x local (x previous for the predicts) on the mixed
    group, each kind on one array and on empty arrays only, and gather and scatter on every
    group."""
    cases = []
    for kind in UPDATE_KINDS:
        for previous in ((False, True) if kind in PREDICT_KINDS else (False,)):
            for clip, adaptive, local in itertools.product((False, True), repeat=3):
                cases.append(dict(kind=kind, group="mixed", clip=clip, adaptive=adaptive,
                                  local=local, previous=previous))
            for adaptive in (False, True):
                cases.append(dict(kind=kind, group="one", clip=True, adaptive=adaptive,
                                  local=True, previous=previous))
            cases.append(dict(kind=kind, group="empty", clip=False, adaptive=True, local=True,
                              previous=previous))
    for kind, group in itertools.product(("gather", "scatter"), sorted(GROUPS)):
        cases.append(dict(kind=kind, group=group, clip=False, adaptive=False, local=False,
                          previous=False))
    return cases


def _write_case(folder, index, case):
    """Writes case `index` (case.txt, arrays.f32) into its own folder; fills in its sizes and
    rates, and returns (folder, the arrays it starts from)."""
    import numpy as np
    rng = np.random.default_rng(1000 + index)
    sizes = case["sizes"] = GROUPS[case["group"]]
    num, total = len(sizes), sum(sizes)
    case["lrs"] = [float(x) for x in rng.uniform(0.01, 0.2, num)]
    case["wds"] = [float(x) for x in rng.choice([0.0, 0.01, 0.05], num)]
    case["prev_decays"] = [float(x) for x in rng.choice([0.0, 1e-3, 0.02], num)]
    case["own_scales"] = [float(x) for x in rng.choice([1.0, 3.0, 3 / 1.9], num)]
    case["prev_scales"] = [float(x) for x in rng.choice([0.0, 2 / 3, 1.5], num)] \
        if case["previous"] else [0.0] * num

    def normal(scale):
        return (scale * rng.standard_normal(total)).astype(np.float32)

    W = normal(1.0)
    update = case["kind"] in UPDATE_KINDS
    arrays = {"weight": np.full(total, np.nan, np.float32) if update else normal(1.0),
              "grad": normal(2.0), "global": W,
              "aux": W + normal(0.1) if case["kind"] != "sgd" else normal(0.1),
              "var": rng.uniform(0.0, 1.0, total).astype(np.float32), "est": normal(0.1),
              "local": W + normal(0.3), "flat": normal(1.0)}
    path = os.path.join(folder, "case%02d" % index)
    os.makedirs(path)
    hyper = [HYPER["rescale_grad"], CLIP if case["clip"] else -1.0, HYPER["momentum"],
             lam_of(case), HYPER["beta"], HYPER["eps"]]
    lines = ["kind %s" % case["kind"],
             "flags %d %d %d %d" % (case["clip"], case["adaptive"], case["previous"],
                                    case["local"]),
             "hyper " + " ".join(map(repr, map(float, hyper))),
             "sizes %d %s" % (num, " ".join(map(str, sizes)))]
    lines += ["%s %s" % (key, " ".join(map(repr, case[key])))
              for key in ("lrs", "wds", "prev_decays", "own_scales", "prev_scales")]
    with open(os.path.join(path, "case.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    np.concatenate([arrays[name] for name in SLOTS]).astype("<f4").tofile(
        os.path.join(path, "arrays.f32"))
    return path, arrays


def _compare(case, before, path):
    """Messages for every array of the driver's result.f32 that differs from reference()."""
    import numpy as np
    total = sum(case["sizes"])
    raw = np.fromfile(os.path.join(path, "result.f32"), dtype="<f4")
    if raw.size != total * len(SLOTS):
        return ["result.f32 holds %d floats, expected %d" % (raw.size, total * len(SLOTS))]
    got = dict(zip(SLOTS, np.split(raw, len(SLOTS))))
    expected = reference(case, before)
    problems = []
    for name in SLOTS:
        if name in _computed(case):
            close = np.isclose(got[name], expected[name], rtol=RTOL, atol=ATOL)
        else:
            close = got[name] == expected[name]
        if not close.all():
            i = int(np.argmin(close))
            problems.append("%s: %d of %d elements differ, first at %d: %r, expected %r"
                            % (name, int((~close).sum()), total, i, float(got[name][i]),
                               float(expected[name][i])))
    return problems


def _describe(case):
    flags = [name for name in ("clip", "adaptive", "local", "previous") if case[name]]
    return "%s on %s arrays%s" % (case["kind"], case["group"],
                                  " (%s)" % ", ".join(flags) if flags else "")


def run_correctness(driver, folder):
    """Runs every correctness case in one driver process; returns (number of cases,
    {description of a failed case: its messages}), or raises _NoDevice."""
    cases = correctness_cases()
    written = [_write_case(folder, i, case) for i, case in enumerate(cases)]
    _run_driver([driver, "run"] + [path for path, _ in written])
    failed = {}
    for case, (path, before) in zip(cases, written):
        problems = _compare(case, before, path)
        if problems:
            failed[_describe(case)] = problems
    return len(cases), failed


class _NoDevice(Exception):
    """The driver found no usable CUDA device (its message says why)."""


def _run_driver(command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=600)
    if result.returncode == 2:
        raise _NoDevice(result.stdout.strip())
    if result.returncode:
        raise NativeBuildError("the driver failed (exit status %d): %s"
                               % (result.returncode, result.stderr.strip()
                                  or result.stdout.strip()))
    return result.stdout


# ------------------------------------------------------------------------------------------
# Bandwidth

def resnet50_sizes():
    """Element counts of ResNet-50 v1's 161 trainable arrays in network order: 53
    convolutions (no biases), a BatchNorm gamma and beta after each, the classifier's weight
    and bias; 25,557,032 elements."""
    sizes = []

    def conv_bn(cin, cout, kernel):
        sizes.extend([cin * cout * kernel * kernel, cout, cout])

    conv_bn(3, 64, 7)
    cin = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for block in range(blocks):
            conv_bn(cin, width, 1)
            conv_bn(width, width, 3)
            conv_bn(width, 4 * width, 1)
            if block == 0:
                conv_bn(cin, 4 * width, 1)     # the projection shortcut
            cin = 4 * width
    return sizes + [2048 * 1000, 1000]


def bytes_per_element(kind, adaptive=False):
    """Bytes a call must move per element: the arrays it reads and writes, 4 bytes each. The
    bench's updates read w_t from local_flat and write w_{t+1} to it and to the weight."""
    reads, writes = {"sgd": (4, 3), "predict": (4, 2), "predict+previous": (5, 3),
                     "nag_predict": (5, 3), "nag_predict+previous": (5, 3), "gather": (1, 1),
                     "scatter": (1, 1), "copy": (1, 1)}[kind]
    return 4 * (reads + writes + (2 if adaptive else 0))


def run_bandwidth(driver, repeats, sizes):
    """{label: (median seconds, fastest seconds)} of the driver's bench on `sizes`."""
    out = _run_driver([driver, "bench", str(repeats)] + [str(n) for n in sizes])
    times = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "time":
            times[parts[1]] = (float(parts[2]), float(parts[3]))
    return times


def print_bandwidth(times, sizes, repeats):
    """The bandwidth table; returns the smallest ratio of the multi-array kernel on the P
    arrays to the grid-stride kernel on one array (the >= 0.9 target)."""
    total, num = sum(sizes), len(sizes)

    def gbps(label, nbytes):
        return nbytes * total / times[label][0] / 1e9 if label in times else None

    def cell(value, width, form="%.0f"):
        return ("-" if value is None else form % value).rjust(width)

    print("bandwidth, %d float32 elements: one array, and ResNet-50 v1's %d arrays; GB/s = "
          "bytes the call must move / median of %d timed calls (multi-array calls include "
          "the table upload), 1 GB = 1e9 bytes" % (total, num, repeats))
    print("%-22s %6s %11s %10s %10s %10s %10s %10s"
          % ("kernel", "B/elem", "grid-stride", "multi x1", "multi x%d" % num, "x%d/x1" % num,
             "x%d/grid" % num, "x1/copy"))
    copy = gbps("copy", 8)
    print("%-22s %6d %11s %10s %10s" % ("device-to-device copy", 8, "-", cell(copy, 10), "-"))
    worst = None
    bench_kinds = UPDATE_KINDS + tuple(kind + "+previous" for kind in PREDICT_KINDS)
    for kind, adaptive in itertools.chain(itertools.product(bench_kinds, (False, True)),
                                          [("gather", None), ("scatter", None)]):
        suffix = kind if adaptive is None else "%s:%s" % (kind, "adaptive" if adaptive
                                                         else "constant")
        nbytes = bytes_per_element(kind, bool(adaptive))
        grid, one, many = (gbps(prefix + suffix, nbytes)
                           for prefix in ("grid-stride:", "one:", "many:"))
        to_one = many / one if many and one else None
        to_grid = many / grid if many and grid else None
        if to_grid is not None:
            worst = to_grid if worst is None else min(worst, to_grid)
        print("%-22s %6d %11s %10s %10s %10s %10s %10s"
              % (suffix.replace(":", " "), nbytes, cell(grid, 11), cell(one, 10),
                 cell(many, 10), cell(to_one, 10, "%.2f"), cell(to_grid, 10, "%.2f"),
                 cell(one / copy if one and copy else None, 10, "%.2f")))
    return worst


# ------------------------------------------------------------------------------------------

def check_gpu(nvcc=None, repeats=20, verbose=True):
    """Runs the check; returns the exit status (0: passed or skipped, 1: failed)."""
    gpu, why = find_gpu()
    if gpu is None:
        _say("skipped: no GPU (%s)" % why)
        return 0
    nvcc_path, why = find_nvcc(nvcc)
    if nvcc_path is None:
        _say("skipped: no nvcc (%s); GPU: %s" % (why, gpu["name"]))
        return 0
    _say("%s (compute capability %s, driver %s), nvcc %s"
         % (gpu["name"], "?" if gpu["arch"] is None else "%d.%d" % divmod(gpu["arch"], 10),
            gpu["driver"], nvcc_path))
    try:
        with tempfile.TemporaryDirectory(prefix="odsgd-gpu-check-") as folder:
            driver, archs = build_gpu_check_driver(nvcc_path, folder,
                                                   archs=_driver_archs(nvcc_path, gpu),
                                                   verbose=verbose)
            _say("driver built for sm_%s" % ", sm_".join(map(str, archs)))
            count, failed = run_correctness(driver, folder)
            for case, problems in failed.items():
                for problem in problems:
                    _say("FAILED %s: %s" % (case, problem))
            _say("%d of %d calls match the NumPy reference (rtol %g, atol %g; copies and "
                 "untouched arrays exact)" % (count - len(failed), count, RTOL, ATOL))
            sizes = resnet50_sizes()
            worst = print_bandwidth(run_bandwidth(driver, repeats, sizes), sizes, repeats)
    except _NoDevice as err:
        _say("skipped: no GPU (the CUDA runtime says: %s)" % err)
        return 0
    except NativeBuildError as err:
        _say("failed: %s" % err)
        return 1
    if worst is not None:
        _say("multi-array kernel on %d arrays: %.0f%% of the grid-stride kernel's bandwidth "
             "at worst (target >= 90%%)" % (len(sizes), 100 * worst))
    if failed:
        _say("failed: %d of %d calls gave wrong results" % (len(failed), count))
        return 1
    return 0
