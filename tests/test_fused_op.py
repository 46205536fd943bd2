"""The fused C++ operators (kvstore_ext/, odsgd.native) on one array against the NumPy
reference: `local_update_` and `predict_update_` are the multi-array operators with P = 1
(one operator family; tests/test_multi_update_op.py covers groups of arrays).

Every case runs five steps with the state (mom, var) carried over, on seeded random arrays,
and compares weight and states after each step with tests/od_reference.py (docs/spec.md, section 4).

Tolerance: each output element is a chain of about a dozen float32 operations on O(1) values;
each rounds by at most half an ulp (6e-8 relative), and the momentum carries errors over the
five steps, so a correct kernel stays within about 1e-6 relative (in practice the x86-64-v2
build, which has no FMA and keeps the formula's order, matches bit for bit). rtol=1e-5 with
atol=1e-6 (for elements near zero) leaves a margin of ten while a wrong term, coefficient or
sign moves results by 1e-3 or more with the magnitudes chosen below.
"""
import itertools
import json
import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

import od_reference as ref

# MXNet's own modules warn about NumPy and SciPy APIs on every mx.nd.array; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL, ATOL = 1e-5, 1e-6
STEPS = 5
# 1 and 3: below one SIMD vector; 1023: vector body plus remainder; 100003 and 300x1001: split
# over threads (the kernels thread above 32768 elements per thread); 2-D and 3-D shapes.
SHAPES = [(1,), (3,), (1023,), (100003,), (17, 31), (300, 1001), (2, 3, 5)]
MODES = ["constant", "adaptive"]


def _newest_source_mtime():
    folder = os.path.join(REPO, "kvstore_ext")
    return max(os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder))


@pytest.fixture(scope="session")
def native():
    """odsgd.native with the library loaded; (re)builds it first when missing or older than
    kvstore_ext/. The build runs as `python -m odsgd.native build` in a child process because
    `import odsgd` loads the library, and a process cannot load a rebuilt one after that."""
    lib = os.environ.get("ODSGD_NATIVE_LIB") or os.path.join(REPO, "odsgd", "lib",
                                                             "libodsgd_ext.so")
    if not os.path.exists(lib) or os.path.getmtime(lib) < _newest_source_mtime():
        result = subprocess.run([sys.executable, "-m", "odsgd.native", "build", "--quiet"],
                                cwd=REPO, env=_child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, universal_newlines=True)
        if result.returncode:
            pytest.fail("python -m odsgd.native build failed:\n" + result.stdout)
    import odsgd.native as native_module
    assert native_module.load(), "the library was built but load() returned False"
    if os.path.getmtime(native_module.loaded_path()) < _newest_source_mtime():
        pytest.fail("this process loaded a library older than kvstore_ext/ (imported before "
                    "the rebuild); run `make native` and rerun the tests")
    return native_module


def _child_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DMLC_ROLE", None)
    env.update(extra)
    return env


def _nd(array):
    import mxnet as mx
    return mx.nd.array(array, dtype="float32")


def _close(actual, expected, what):
    np.testing.assert_allclose(actual.asnumpy(), expected, rtol=RTOL, atol=ATOL, err_msg=what)


def _last_extension_error(err):
    """The newest message of an MXNetError raised by the extension library. MXNet 1.9 lists
    every message the library ever recorded (lib_api.cc never clears them), newest last."""
    lines = [line for line in str(err).splitlines() if line.strip().startswith("[")]
    return lines[-1] if lines else str(err)


def _seed(*case):
    """A seed per test case that, unlike hash(), is the same in every run."""
    return zlib.crc32(repr(case).encode())


def _options(clip, mode, lam, momentum, wd):
    return dict(rescale_grad=0.5, clip_gradient=0.8 if clip else None, lr=0.1,
                momentum=momentum, wd=wd, lam=lam, mode=mode, beta=0.9, eps=1e-7)


def _op_kwargs(options):
    kwargs = dict(options)
    kwargs["adaptive"] = kwargs.pop("mode") == "adaptive"
    return kwargs


def _inputs(rng, shape):
    """w_0 and W_0 a little apart (so the compensation term matters), grads of O(1) after
    rescale_grad=0.5 (so clip=0.8 cuts about 40% of them)."""
    W = rng.standard_normal(shape).astype(np.float32)
    w = (W + 0.3 * rng.standard_normal(shape)).astype(np.float32)
    return w, W


OPTION_GRID = list(itertools.product([False, True], MODES, [0.0, 0.5], [0.0, 0.9], [0.0, 0.05]))


@pytest.mark.parametrize("clip,mode,lam,momentum,wd", OPTION_GRID)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_local_update_matches_reference(native, shape, clip, mode, lam, momentum, wd):
    rng = np.random.default_rng(_seed("local", shape, clip, mode, lam, momentum, wd))
    options = _options(clip, mode, lam, momentum, wd)
    w, W = _inputs(rng, shape)
    m = np.zeros(shape, np.float32)
    v = np.zeros(shape, np.float32)
    # In constant mode var must stay untouched: fill it with values the kernel would change.
    v_start = v if mode == "adaptive" else rng.random(shape).astype(np.float32)
    weight, mom, var = _nd(w), _nd(m), _nd(v_start)
    for t in range(STEPS):
        grad = (2.0 * rng.standard_normal(shape)).astype(np.float32)
        w = ref.local_sgd_step(w, W, grad, m, v, **options)
        returned = native.local_update_(weight, _nd(grad), _nd(W), mom, var,
                                        **_op_kwargs(options))
        assert returned is weight
        _close(weight, w, "weight, step %d" % t)
        _close(mom, m, "mom, step %d" % t)
        _close(var, v if mode == "adaptive" else v_start, "var, step %d" % t)
        W = (W + 0.1 * rng.standard_normal(shape)).astype(np.float32)   # the next W_t


@pytest.mark.parametrize("clip,mode,lam,momentum,wd", OPTION_GRID)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_predict_update_matches_reference(native, shape, clip, mode, lam, momentum, wd):
    rng = np.random.default_rng(_seed("predict", shape, clip, mode, lam, momentum, wd))
    options = _options(clip, mode, lam, momentum, wd)
    options["lr"] = 0.02      # a global lr: the step is N times the averaged gradient
    w, W = _inputs(rng, shape)
    W_prev = W.copy()         # no earlier global weights at the first step
    v = np.zeros(shape, np.float32)
    v_start = v if mode == "adaptive" else rng.random(shape).astype(np.float32)
    weight, var = _nd(w), _nd(v_start)
    for t in range(STEPS):
        grad = (2.0 * rng.standard_normal(shape)).astype(np.float32)
        w = ref.predict_step(w, W, W_prev, grad, v, num_workers=4, **options)
        returned = native.predict_update_(weight, _nd(grad), _nd(W), _nd(W_prev), var,
                                          num_workers=4, **_op_kwargs(options))
        assert returned is weight
        _close(weight, w, "weight, step %d" % t)
        _close(var, v if mode == "adaptive" else v_start, "var, step %d" % t)
        W_prev, W = W, (W + 0.1 * rng.standard_normal(shape)).astype(np.float32)


@pytest.mark.skipif(os.environ.get("OMP_NUM_THREADS") == "3",
                    reason="this is the child run the test starts")
def test_threaded_kernels_match_reference(native):
    """The kernels split arrays over OpenMP threads as MXNet's engine allows (half the logical
    CPUs on x86, OMP_NUM_THREADS when set), so on a small machine the cases above may all run
    on one thread. This reruns the multi-thread-sized cases with OMP_NUM_THREADS=3, which
    gives three chunks with a remainder (100003 and 300300 elements)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
         os.path.abspath(__file__), "-k", "matches_reference and (100003 or 300x1001)"],
        cwd=REPO, env=_child_env(OMP_NUM_THREADS="3"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-5000:]
    assert "128 passed" in summary, summary


def test_updates_the_callers_arrays_in_place(native):
    """weight, mom and var keep their NDArray objects and memory: views taken before the call
    (which share the buffers) see the new values."""
    rng = np.random.default_rng(1)
    shape = (64, 33)
    w, W = _inputs(rng, shape)
    m, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    weight, mom, var = _nd(w), _nd(m), _nd(v)
    views = [a.reshape((-1,)) for a in (weight, mom, var)]
    options = _options(True, "adaptive", 0.5, 0.9, 0.05)
    grad = rng.standard_normal(shape).astype(np.float32)
    w = ref.local_sgd_step(w, W, grad, m, v, **options)
    native.local_update_(weight, _nd(grad), _nd(W), mom, var, **_op_kwargs(options))
    for view, expected in zip(views, (w, m, v)):
        np.testing.assert_allclose(view.asnumpy(), expected.reshape(-1), rtol=RTOL, atol=ATOL)


def test_predict_accepts_the_same_array_as_both_global_weights(native):
    """docs/spec.md: W_{t-1} = W_t when no earlier global weights exist; callers pass one array."""
    rng = np.random.default_rng(2)
    shape = (1000,)
    w, W = _inputs(rng, shape)
    grad = rng.standard_normal(shape).astype(np.float32)
    options = _options(False, "adaptive", 0.5, 0.9, 0.05)
    v = np.zeros(shape, np.float32)
    expected = ref.predict_step(w, W, W, grad, v, num_workers=2, **options)
    weight, global_weight, var = _nd(w), _nd(W), _nd(np.zeros(shape, np.float32))
    native.predict_update_(weight, _nd(grad), global_weight, global_weight, var, num_workers=2,
                           **_op_kwargs(options))
    _close(weight, expected, "weight")
    _close(global_weight, W, "global weight must stay unchanged")


@pytest.mark.parametrize("size", [5, 100003])
def test_without_out_the_result_is_a_new_array(native, size):
    """Called without out= the operator (one array, P = 1; the weights are outputs only)
    returns w_{t+1} in a new array, and still updates mom and local_flat (declared mutable
    inputs)."""
    import mxnet as mx
    rng = np.random.default_rng(3)
    w, W = _inputs(rng, (size,))
    m, v = np.zeros(size, np.float32), np.zeros(size, np.float32)
    grad = rng.standard_normal(size).astype(np.float32)
    options = _options(False, "constant", 0.5, 0.9, 0.0)
    expected = ref.local_sgd_step(w, W, grad, m, v, **options)
    local, mom = _nd(w), _nd(np.zeros(size, np.float32))
    result = mx.nd.odsgd_multi_local_update(_nd(grad), _nd(W), mom, _nd(v), local,
                                            num_arrays=1, lrs=0.1, wds=0.0, local=1,
                                            rescale_grad=0.5, clip_gradient=-1, momentum=0.9,
                                            lam=0.5, adaptive=0, beta=0.9, eps=1e-7)
    _close(result, expected, "result")
    _close(local, expected, "local_flat")
    _close(mom, m, "mom")


@pytest.mark.parametrize("which", ["local", "predict"])
def test_constant_mode_takes_no_var(native, which):
    """var=None outside adaptive mode: a 1-element placeholder stands in, results unchanged."""
    rng = np.random.default_rng(4)
    shape = (777,)
    w, W = _inputs(rng, shape)
    grad = rng.standard_normal(shape).astype(np.float32)
    options = _options(True, "constant", 0.5, 0.9, 0.05)
    v = np.zeros(shape, np.float32)
    weight = _nd(w)
    if which == "local":
        m = np.zeros(shape, np.float32)
        expected = ref.local_sgd_step(w, W, grad, m, v, **options)
        native.local_update_(weight, _nd(grad), _nd(W), _nd(np.zeros(shape, np.float32)), None,
                             **_op_kwargs(options))
    else:
        expected = ref.predict_step(w, W, W, grad, v, num_workers=3, **options)
        native.predict_update_(weight, _nd(grad), _nd(W), _nd(W), None, num_workers=3,
                               **_op_kwargs(options))
    _close(weight, expected, "weight")


def test_adaptive_mode_requires_var(native):
    a = _nd(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="var is required"):
        native.local_update_(a, a.copy(), a.copy(), a.copy(), None,
                             **_op_kwargs(_options(False, "adaptive", 0.5, 0.0, 0.0)))


def _call_local(native, arrays, **changes):
    import mxnet as mx
    kwargs = _op_kwargs(_options(False, "adaptive", 0.5, 0.9, 0.0))
    kwargs.update(changes)
    native.local_update_(*arrays, **kwargs)
    mx.nd.waitall()     # errors found inside the kernel surface at the next wait


def _arrays(shape=(6,), dtype="float32", **replace):
    import mxnet as mx
    names = ["weight", "grad", "global_weight", "mom", "var"]
    arrays = {name: mx.nd.ones(shape, dtype=dtype) for name in names}
    arrays.update(replace)
    return [arrays[name] for name in names]


# The operator is the multi-array one (P = 1): its messages name weights[0], grads[0] and the
# flat arrays (mom and var are passed as flat views of themselves).
@pytest.mark.parametrize("case,message", [
    ("float64", "only float32"),
    ("float16_grad", "input 'grads[0]' has dtype"),
    # local_update_ passes a flat copy of the weight (6 elements) as local_flat; the operator
    # takes the sizes from the gradients (the weights are outputs only).
    ("grad_shape", "'global_flat' has shape (6,) but must be 1-D of length 5 (the sum of the "
                   "gradients' sizes"),
    ("var_shape", "'var_flat' has shape (1,) but must be 1-D of length 6"),
    ("mom_is_weight", "shares memory with"),
    ("eps_zero", "eps must be > 0"),
    ("bad_number", "attribute 'lrs' item 0 is not a finite number"),
])
def test_misuse_gets_a_clear_error(native, case, message):
    import mxnet as mx
    changes = {}
    if case == "float64":
        arrays = _arrays(dtype="float64")
    elif case == "float16_grad":
        arrays = _arrays(grad=mx.nd.ones((6,), dtype="float16"))
    elif case == "grad_shape":
        arrays = _arrays(grad=mx.nd.ones((5,)))
    elif case == "var_shape":
        arrays = _arrays(var=mx.nd.ones((1,)))
    elif case == "mom_is_weight":
        arrays = _arrays()
        arrays[3] = arrays[0]
    elif case == "eps_zero":
        arrays, changes = _arrays(), {"eps": 0.0}
    else:
        arrays, changes = _arrays(), {"lr": float("nan")}
    with pytest.raises(mx.base.MXNetError) as caught:
        _call_local(native, arrays, **changes)
    assert message in _last_extension_error(caught.value)
    if case == "mom_is_weight":
        assert "'weights[0]'" in _last_extension_error(caught.value)
        assert "'mom_flat'" in _last_extension_error(caught.value)


@pytest.mark.parametrize("num_workers", [0, 2.5, True])
def test_predict_rejects_a_bad_worker_count(native, num_workers):
    a = _arrays()
    with pytest.raises(ValueError, match="num_workers must be an integer >= 1, got %r"
                       % (num_workers,)):
        native.predict_update_(a[0], a[1], a[2], a[2], a[4], num_workers=num_workers,
                               **_op_kwargs(_options(False, "adaptive", 0.5, 0.9, 0.0)))


def test_unknown_attribute_is_refused(native):
    import mxnet as mx
    a = _arrays()
    with pytest.raises(mx.base.MXNetError) as caught:
        mx.nd.odsgd_multi_local_update(*a[1:], a[0].copy(), out=a[0], num_arrays=1, lrs=0.1,
                                       wds=0, local=0, rescale_grad=1, clip_gradient=-1,
                                       momentum=0.9, lam=0, adaptive=0, beta=0.9, eps=1e-7,
                                       learning_rate=0.1)
    assert "unknown attribute 'learning_rate'" in _last_extension_error(caught.value)


def test_build_record_matches_the_running_mxnet(native):
    import mxnet as mx
    info = native.build_info()
    assert native.release(info["mxnet_version"]) == native.release(mx.__version__)
    assert info["cuda_compiled"] == (info["cuda_command"] is not None)
    assert native.supports(mx.cpu())
    assert native.load() is True          # a second call keeps the loaded library


def test_version_strings_compare_as_numbers(native):
    assert native.release("1.9.1") == (1, 9, 1)
    assert native.release("1.9.1.post0") == (1, 9, 1)
    assert native.release("1.10") == (1, 10, 0)
    assert native.release("1.10.0") > native.release("1.9.1")


def _run_child(script, **env):
    """Runs `script` in a fresh interpreter (a process that has not loaded the library) and
    returns the JSON object it prints last."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO,
                            env=_child_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


_NEW_FUNCTIONS = """
    import json, sys
    import mxnet as mx
    places = {"nd": mx.nd, "nd.op": mx.nd.op, "sym": mx.sym, "sym.op": mx.sym.op}
    before = {place: set(dir(module)) for place, module in places.items()}
    %s
    x = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])
    parts = mx.nd.zeros((5,))
    mx.nd.odsgd_gather(x, mx.nd.array([5.0]), num_arrays=2, out=parts)
    print(json.dumps({
        "added": {place: sorted(set(dir(module)) - before[place])
                  for place, module in places.items()},
        "signature": {name: getattr(mx.nd, name).__doc__.split("Parameters")[1]
                      for name in sorted(set(dir(mx.nd)) - before["nd"])},
        "gathered": parts.asnumpy().tolist()}))
    """


def test_loading_registers_what_mxnets_own_library_load_registers(native):
    """load() registers the library's operators itself (MXNet's mx.library.load regenerates
    the function of every operator, a second per process): the same names in mx.nd, mx.nd.op,
    mx.sym and mx.sym.op, with the same parameters, and they run, as after mx.library.load."""
    lib = native.loaded_path()
    ours = _run_child(_NEW_FUNCTIONS % "import odsgd.native as native; native.load()",
                      ODSGD_NATIVE_LIB=lib)
    mxnets = _run_child(_NEW_FUNCTIONS % ("mx.library.load(%r, verbose=False)" % lib),
                        ODSGD_NATIVE_LIB=lib)
    from odsgd.native.library import OP_NAMES
    for place in ("nd", "nd.op", "sym", "sym.op"):
        assert set(OP_NAMES) <= set(mxnets["added"][place]), (place, mxnets["added"][place])
    assert ours == mxnets
    assert ours["gathered"] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_missing_library_logs_one_warning_and_falls_back(native, tmp_path):
    """Without the library, `import odsgd` (which calls load()) and further load() calls give
    False and exactly one warning naming the fallback and the build command."""
    out = _run_child("""
        import json, logging
        records = []
        class Collect(logging.Handler):
            def emit(self, record):
                records.append(record)
        logging.getLogger("odsgd").addHandler(Collect())
        import odsgd.native as native
        results = [native.load(), native.load()]
        warnings = [r.getMessage() for r in records
                    if r.levelno == logging.WARNING and "native" in r.pathname]
        print(json.dumps({"results": results, "loaded": native.is_loaded(),
                          "warnings": warnings}))
        """, ODSGD_NATIVE_LIB=str(tmp_path / "libodsgd_ext.so"))
    assert out["results"] == [False, False]
    assert out["loaded"] is False
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "NDArray fallback" in out["warnings"][0]
    assert "python -m odsgd.native build" in out["warnings"][0]


def test_library_built_for_another_mxnet_is_refused(native, tmp_path):
    """A build record naming another MXNet version makes load() (at `import odsgd`) raise an
    ImportError that names both versions and the rebuild command."""
    import shutil
    import mxnet as mx
    lib = tmp_path / "libodsgd_ext.so"
    shutil.copy(native.loaded_path(), lib)
    info = dict(native.build_info(), mxnet_version="1.8.0")
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    out = _run_child("""
        import json
        try:
            import odsgd.native as native
            native.load()
            print(json.dumps({"error": None}))
        except ImportError as err:
            print(json.dumps({"error": str(err)}))
        """, ODSGD_NATIVE_LIB=str(lib))
    assert out["error"] is not None
    for expected in ("1.8.0", mx.__version__, "make native", "python -m odsgd.native build"):
        assert expected in out["error"]


def test_build_command_fails_clearly_without_a_compiler(native):
    result = subprocess.run([sys.executable, "-m", "odsgd.native", "build"], cwd=REPO,
                            env=_child_env(CXX="no-such-compiler-odsgd"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=120)
    assert result.returncode == 1
    assert "build failed" in result.stderr and "no-such-compiler-odsgd" in result.stderr


def test_cuda_check_fails_clearly_without_nvcc(native):
    result = subprocess.run([sys.executable, "-m", "odsgd.native", "check-cuda", "--nvcc",
                             "no-such-nvcc-odsgd"], cwd=REPO, env=_child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=120)
    assert result.returncode == 1
    assert "check-cuda failed" in result.stderr and "no-such-nvcc-odsgd" in result.stderr


def test_installed_headers_are_the_cuda_wheels(native):
    """The CUDA check builds against the CPU wheel's extension headers because they are
    byte-identical to mxnet-cu112's (recorded hashes); a mismatch must fail the check."""
    import importlib
    import mxnet as mx
    build = importlib.import_module("odsgd.native.build")   # the package re-exports build()
    include = os.path.join(os.path.dirname(mx.__file__), "include")
    build._check_cu112_interface(include)      # raises on a mismatch
    with pytest.raises(build.NativeBuildError, match="differs from the one in mxnet-cu112"):
        original = dict(build.CU112_INTERFACE_SHA256)
        try:
            build.CU112_INTERFACE_SHA256[("mxnet", "lib_api.h")] = "0" * 64
            build._check_cu112_interface(include)
        finally:
            build.CU112_INTERFACE_SHA256.clear()
            build.CU112_INTERFACE_SHA256.update(original)


def test_package_imports_without_mxnet_on_servers():
    """On a parameter server `import mxnet` never returns, so odsgd.native and its modules
    must import without importing mxnet."""
    out = _run_child("""
        import json, sys
        import odsgd.native, odsgd.native.build, odsgd.native.ops, odsgd.native.layout
        print(json.dumps({"mxnet_imported": "mxnet" in sys.modules}))
        """, DMLC_ROLE="server")
    assert out == {"mxnet_imported": False}
