"""`python -m odsgd.native check-gpu` (odsgd/native/gpu_check.py, kvstore_ext/gpu_check_driver.cu).

On a machine without a GPU (CI, this one) the command must say so in one line and exit 0;
with nvcc at hand (.venv/cuda, what `make cuda-check` installs) its driver must compile and
link with the CUDA kernels, and, run without a GPU, must say so instead of failing. Where a
GPU is present the whole check runs and must pass. The NumPy reference the check holds the
GPU to is itself checked here against the test suite's reference (tests/od_reference.py).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import od_reference as ref

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.path.join(REPO, ".venv", "cuda", "nvidia", "cu13", "bin", "nvcc")


# Runs `python -m odsgd.native ...` in a Python where `import mxnet` fails, as on a GPU
# machine that has no MXNet (MXNet 1.9.1's wheels have no code for recent GPUs).
WITHOUT_MXNET = """
import importlib.abc, runpy, sys
class NoMXNet(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mxnet" or name.startswith("mxnet."):
            raise ModuleNotFoundError("No module named 'mxnet'", name="mxnet")
        return None
sys.meta_path.insert(0, NoMXNet())
sys.argv = ["odsgd.native"] + sys.argv[1:]
if sys.argv[1] == "probe":
    import odsgd
    print("installed" if odsgd.MXNET_INSTALLED else "missing")
    odsgd.DistODSGD
runpy.run_module("odsgd.native", run_name="__main__", alter_sys=True)
"""


def _check_gpu(*args, path=None, timeout=1200, mxnet=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if path is not None:
        env["PATH"] = path
    command = ["-m", "odsgd.native"] if mxnet else ["-c", WITHOUT_MXNET]
    return subprocess.run([sys.executable] + command + ["check-gpu", "--quiet"]
                          + list(args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)


def _has_gpu():
    from odsgd.native.gpu_check import find_gpu
    return find_gpu()[0] is not None


def test_check_gpu_on_this_machine():
    """Without a GPU (CI, this machine): one line naming why, exit status 0. With one: the
    whole check runs and every call matches the NumPy reference."""
    if _has_gpu():
        result = _check_gpu("--repeats", "5")
        assert result.returncode == 0, result.stdout
        assert "calls match the NumPy reference" in result.stdout
        return
    result = _check_gpu()
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("odsgd.native check-gpu: skipped: no GPU (")
    assert "nvidia-smi" in lines[0]


@pytest.mark.parametrize("mxnet", [True, False], ids=["with-mxnet", "without-mxnet"])
def test_without_nvcc_it_says_so_in_one_line(tmp_path, mxnet):
    """A (fake) GPU but no nvcc: one line naming both, exit status 0; also where MXNet is not
    installed (`import odsgd` must not need it for this command)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Fake GPU, 550.54, 9.0'\n")
    smi.chmod(0o755)
    result = _check_gpu("--nvcc", str(tmp_path / "no-such-nvcc"),
                        path=str(tmp_path) + os.pathsep + os.environ["PATH"], timeout=120,
                        mxnet=mxnet)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("odsgd.native check-gpu: skipped: no nvcc (")
    assert "no-such-nvcc" in lines[0] and "Fake GPU" in lines[0]


def test_without_mxnet_the_store_names_what_to_install():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", WITHOUT_MXNET, "probe"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True, timeout=120)
    assert result.returncode != 0
    assert result.stdout.startswith("missing\n"), result.stdout
    assert "ImportError: odsgd.DistODSGD needs MXNet, which is not installed: pip install " \
           "mxnet==1.9.1" in result.stdout


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc in .venv/cuda (make cuda-check)")
def test_the_driver_compiles_and_reports_a_missing_device(tmp_path):
    """The driver and the kernels compile and link as check-cuda compiles them (one
    architecture here, to keep it short); without a device the driver exits 2 with a line."""
    from odsgd.native.build import build_gpu_check_driver
    driver, archs = build_gpu_check_driver(NVCC, str(tmp_path), archs=[90], verbose=False)
    assert archs == [90] and os.access(driver, os.X_OK)
    if _has_gpu():
        return
    result = subprocess.run([driver, "run", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.startswith("no CUDA device: ")


def _suite_reference(case, before):
    """What tests/od_reference.py says the update call of `case` leaves in weight, aux (sgd's
    momentum), var and est, array by array, with w_t from local (the weights are NaN: the
    call only writes them), or W_t where lam is 0 and there is no local."""
    from odsgd.native.gpu_check import CLIP, HYPER, lam_of
    out = {name: before[name].copy() for name in ("weight", "aux", "var", "est")}
    old_weights = before["local"] if case["local"] else before["global"]
    common = dict(rescale_grad=HYPER["rescale_grad"], momentum=HYPER["momentum"],
                  lam=lam_of(case), mode="adaptive" if case["adaptive"] else "constant",
                  beta=HYPER["beta"], eps=HYPER["eps"],
                  clip_gradient=CLIP if case["clip"] else None)
    offset = 0
    for k, size in enumerate(case["sizes"]):
        part = slice(offset, offset + size)
        offset += size
        w, W, grad = old_weights[part], before["global"][part], before["grad"][part]
        aux, var, est = out["aux"][part], out["var"][part], out["est"][part]
        rates = dict(lr=case["lrs"][k], wd=case["wds"][k], **common)
        estimate = dict(num_workers=1, own_scale=case["own_scales"][k],
                        prev_scale=case["prev_scales"][k] if case["previous"] else None)
        if case["kind"] == "sgd":
            out["weight"][part] = ref.local_sgd_step(w, W, grad, aux, var, **rates)
        elif case["kind"] == "predict":
            out["weight"][part] = ref.predict_step(w, W, aux, grad, var, est=est,
                                                   prev_decay=case["prev_decays"][k],
                                                   **estimate, **rates)
        else:
            out["weight"][part] = ref.nag_predict_step(w, W, aux, grad, est, var,
                                                       prev_decay=case["prev_decays"][k],
                                                       **estimate, **rates)
    return out


def test_the_checks_reference_is_the_suites_reference(tmp_path):
    """check-gpu holds the GPU to its own vectorised NumPy reference (no GPU here to run the
    kernels): on every update case it writes, that reference gives what tests/od_reference.py
    gives array by array (rtol 1e-5 / atol 1e-6, as the check itself), the predicts' estimate
    of the round's sum with and without the previous round included, w_t from local_flat
    (lam != 0) and without it (lam 0)."""
    from odsgd.native import gpu_check
    cases = [c for c in gpu_check.correctness_cases() if c["kind"] in gpu_check.UPDATE_KINDS]
    assert {(c["kind"], c["previous"]) for c in cases} == {
        ("sgd", False), ("predict", False), ("predict", True), ("nag_predict", False),
        ("nag_predict", True)}
    assert {c["local"] for c in cases} == {False, True}
    for index, case in enumerate(cases):
        _, before = gpu_check._write_case(str(tmp_path), index, case)
        vectorised = gpu_check.reference(case, before)
        for name, expected in _suite_reference(case, before).items():
            np.testing.assert_allclose(vectorised[name], expected, rtol=gpu_check.RTOL,
                                       atol=gpu_check.ATOL,
                                       err_msg="%s: %s" % (gpu_check._describe(case), name))
