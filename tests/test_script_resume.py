"""Exact resume in the training scripts (odsgd/training/checkpoints.py): the seeded data gives
the same batches from step k on whether an iterator started at 0 or at k, mid-epoch too; the
flags refuse what cannot resume; and real 2-worker jobs, run uninterrupted and run to a
mid-epoch checkpoint, stopped and resumed with --resume auto, end with every worker's own
weights w^i and the global weights W equal bit for bit."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
import uuid

import mxnet as mx
import numpy as np
import pytest
from scipy import stats

from cluster import REPO, WatchedLauncher, run_job
from odsgd.common import checkpoint_index
from odsgd.training import checkpoints, data, epoch_saves, imperative, options, session
from test_imagenet_recipe import load_script, write_image_folder
from test_training_scripts import read_results, script, write_tiny_imagenet

train_imagenet = load_script()


# -- the seeded iterators ------------------------------------------------------------------
def batches_of(train_iter, epochs, start_epoch=0, skip=0):
    """[(epoch, data, label)] of every batch from batch `skip` of `start_epoch` on."""
    seen = []
    for epoch in range(start_epoch, epochs):
        train_iter.start_epoch(epoch, skip if epoch == start_epoch else 0)
        seen += [(epoch, b.data[0].asnumpy(), b.label[0].asnumpy()) for b in train_iter]
    return seen


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for (epoch, x, y), (epoch_expected, x_expected, y_expected) in zip(got, expected):
        assert epoch == epoch_expected
        np.testing.assert_array_equal(x, x_expected)
        np.testing.assert_array_equal(y, y_expected)


def cifar_like_iter(rank, seed=3, steps=6):
    """ArrayIter over 26 uint8 images with CIFAR's pad-crop-flip, 6 batches of 4 an epoch."""
    X = np.random.RandomState(0).randint(0, 256, (26, 3, 8, 8)).astype(np.uint8)
    transform = data.pad_crop_flip(data.normalize(data.CIFAR_MEAN, data.CIFAR_STD, 1 / 255.0),
                                   pad=2)
    return data.resized_to(data.ArrayIter(X, np.arange(26), 4, transform, seed=seed,
                                          rank=rank), steps)


@pytest.mark.parametrize("start_epoch, skip", [(1, 0), (1, 4), (0, 5), (2, 1)])
def test_array_iter_replays_from_any_batch(start_epoch, skip):
    """An iterator started at batch `skip` of `start_epoch` (a resumed run) gives the batches
    the uninterrupted one gave from there: order and augmentation alike."""
    uninterrupted = batches_of(cifar_like_iter(rank=1), 3)
    assert len(uninterrupted) == 18
    resumed = batches_of(cifar_like_iter(rank=1), 3, start_epoch, skip)
    assert_same_batches(resumed, uninterrupted[6 * start_epoch + skip:])


def test_array_iter_draws_differ_by_epoch_rank_and_seed():
    """What the replay is not: a fixed order. Each epoch is a new permutation of the shard
    (no sample twice in an epoch), each rank and seed draws its own, and the augmentation
    moves the pixels (a batch differs from its samples plainly normalised)."""
    epochs = batches_of(cifar_like_iter(rank=1), 2)
    labels = [np.concatenate([y for e, _, y in epochs if e == epoch]) for epoch in (0, 1)]
    for epoch_labels in labels:
        assert len(set(epoch_labels.tolist())) == 24
    assert labels[0].tolist() != labels[1].tolist()
    for other in (cifar_like_iter(rank=0), cifar_like_iter(rank=1, seed=4)):
        assert np.concatenate([y for _, _, y in batches_of(other, 1)]).tolist() != \
            labels[0].tolist()
    X = np.random.RandomState(0).randint(0, 256, (26, 3, 8, 8)).astype(np.uint8)
    plain = data.normalize(data.CIFAR_MEAN, data.CIFAR_STD, 1 / 255.0)(
        X[epochs[0][2].astype(int)], None)
    assert not np.allclose(epochs[0][1], plain)


def test_synthetic_iter_starts_anywhere():
    synthetic = data.resized_to(data.SyntheticIter(4, (3, 8, 8), 10, 5, seed=2), 5)
    full = batches_of(synthetic, 2)
    assert_same_batches(batches_of(synthetic, 2, 1, 3), full[8:])


@pytest.mark.parametrize("loaders", [0, 1])
def test_image_folder_loader_replays_from_any_batch(tmp_path, monkeypatch, loaders):
    """The image folder's LoaderIter (random resized crop, flip, colour jitter, lighting:
    Python's, NumPy's and MXNet's generators), in the worker process or in a data-loading
    process (-j 1): from batch 1 of epoch 1 it gives what it gave there uninterrupted."""
    root = write_image_folder(tmp_path / "imagenet", per_class=(7, 1))
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    args = train_imagenet.parse_args(["--data-dir", str(root), "--input-size", "16", "-j",
                                      str(loaders)])

    def fresh():
        train, _ = data.imagenet_folder_iterators(args, 1, 2, 3, with_val=False)
        return data.resized_to(train, 3)
    uninterrupted = batches_of(fresh(), 2)
    assert len(uninterrupted) == 6
    assert_same_batches(batches_of(fresh(), 2, 1, 1), uninterrupted[4:])
    # the augmentation draws anew each epoch: an image's crop differs between epochs
    first = {float(y): x for _, xs, ys in uninterrupted[:3] for x, y in zip(xs, ys)}
    second = {float(y): x for _, xs, ys in uninterrupted[3:] for x, y in zip(xs, ys)}
    assert first.keys() == second.keys()
    assert not all(np.array_equal(first[k], second[k]) for k in first)


def test_rec_iter_replays_epochs_and_refuses_mid_epoch(tmp_path, monkeypatch):
    """--use-rec: MXNet's ImageRecordIter, made anew each epoch with the epoch's seed, gives
    epoch 1's batches whether epoch 0 ran before or not; it cannot start mid-epoch."""
    paths = write_tiny_imagenet(tmp_path, train=37, val=2)
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    args = train_imagenet.parse_args([
        "--use-rec", "--rec-train", paths["train"][0], "--rec-train-idx", paths["train"][1],
        "--rec-val", paths["val"][0], "--rec-val-idx", paths["val"][1], "--input-size", "16",
        "-j", "1"])

    def fresh():
        train, _ = data.imagenet_iterators(args, 1, 2, 4, with_val=False)
        return data.resized_to(train, 4)
    uninterrupted = batches_of(fresh(), 2)
    assert_same_batches(batches_of(fresh(), 2, 1), uninterrupted[4:])
    assert not np.array_equal(uninterrupted[0][1], uninterrupted[4][1])
    with pytest.raises(ValueError, match="can only start at an epoch's first batch"):
        fresh().start_epoch(1, 2)


def test_mixup_draws_are_beta_and_keyed_by_batch():
    """lam of batch b of epoch e is a draw of Beta(alpha, alpha) that depends on (seed, rank,
    e, b) alone: asked in any order, the same; 400 of them follow Beta(0.4, 0.4)."""
    targets = imperative.Targets(10, num_epochs=50, mixup=True, mixup_alpha=0.4, seed=5,
                                 rank=1)
    keys = [(epoch, batch) for epoch in range(20) for batch in range(20)]
    draws = {key: targets.mixup_lambda(*key) for key in keys}
    again = imperative.Targets(10, num_epochs=50, mixup=True, mixup_alpha=0.4, seed=5, rank=1)
    assert all(again.mixup_lambda(*key) == draws[key] for key in reversed(keys))
    other_rank = imperative.Targets(10, num_epochs=50, mixup=True, mixup_alpha=0.4, seed=5,
                                    rank=0)
    assert other_rank.mixup_lambda(3, 4) != draws[3, 4]
    assert stats.kstest(list(draws.values()), stats.beta(0.4, 0.4).cdf).pvalue > 0.01


def test_dropout_masks_keyed_by_batch():
    """A network with Dropout gets MXNet's generator seeded from (seed, rank, epoch, batch)
    before each batch: the same masks after any draws before, others at another batch; a
    network without random layers is left alone."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(64), mx.gluon.nn.Dropout(0.5))
    net.initialize(mx.init.One())
    net.hybridize(static_alloc=True, static_shape=True)
    before_batch = imperative.random_layer_seeding(net, seed=3, rank=1)
    x = mx.nd.ones((4, 8))

    def masks(epoch, batch):
        before_batch(epoch, batch)
        with mx.autograd.record():
            return (net(x) == 0).asnumpy()
    first = masks(2, 5)
    assert 0.3 < first.mean() < 0.7
    mx.nd.random.uniform(shape=(1000,)).wait_to_read()     # draws in between
    np.testing.assert_array_equal(masks(2, 5), first)
    assert not np.array_equal(masks(2, 6), first)
    plain = mx.gluon.nn.HybridSequential()
    plain.add(mx.gluon.nn.Dense(4))
    assert imperative.random_layer_seeding(plain, seed=3, rank=1) is None


# -- the flags ----------------------------------------------------------------------------
def parsed(argv, monkeypatch, environ=None):
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    for name in ("ODSGD_CHECKPOINT_DIR", "ODSGD_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (environ or {}).items():
        monkeypatch.setenv(name, value)
    return options.check_arguments(options.build_parser("t", model="m").parse_args(argv))


def test_flags_refuse_what_cannot_resume(monkeypatch):
    for argv, message in (
            (["--mode", "symbolic", "--save-every-steps", "5"], "gives no point between"),
            (["--mode", "symbolic", "--stop-after-steps", "5"], "--stop-after-steps needs"),
            (["--resume", "auto", "--resume-epoch", "2"], "drop --resume-epoch"),
            (["--resume", "auto", "--resume-params", "p"], "drop --resume-params"),
            (["--save-every-steps", "-1"], "must be >= 0"),
            (["--keep-checkpoints", "-2"], "must be >= 0")):
        with pytest.raises(ValueError, match=message):
            parsed(argv, monkeypatch)
    args = options.build_parser("t", model="m").parse_args(["--save-every-steps", "5"])
    args.use_rec = True
    with pytest.raises(ValueError, match="ImageRecordIter cannot start mid-epoch"):
        options.check_arguments(args)


def test_imagenet_script_refuses_steps_with_rec_and_says_why_in_help(tmp_path):
    paths = write_tiny_imagenet(tmp_path, train=4, val=2)
    out = subprocess.run(
        [sys.executable, script("train_imagenet.py"), "--kvstore", "local", "--rec-train",
         paths["train"][0], "--rec-train-idx", paths["train"][1], "--rec-val", paths["val"][0],
         "--rec-val-idx", paths["val"][1], "--save-every-steps", "10"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2 and "ImageRecordIter cannot start mid-epoch" in out.stderr
    helped = subprocess.run([sys.executable, script("train_imagenet.py"), "--help"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    text = " ".join(helped.stdout.split())
    for said in ("--save-every-steps K", "ImageRecordIter cannot start mid-epoch",
                 "--mode symbolic resume at epoch boundaries", "dist_async",
                 "$ODSGD_CHECKPOINT_DIR", "--keep-checkpoints N", "for tests and drills"):
        assert said in text, said


def test_save_dir_from_the_launcher(monkeypatch):
    """ODSGD_CHECKPOINT_DIR (odsgd.launch --checkpoint-dir) is the save dir unless
    --save-dir is given."""
    assert parsed([], monkeypatch).save_dir == options.DEFAULT_SAVE_DIR
    launched = {"ODSGD_CHECKPOINT_DIR": "/shared/ckpt"}
    assert parsed([], monkeypatch, launched).save_dir == "/shared/ckpt"
    assert parsed(["--save-dir", "mine"], monkeypatch, launched).save_dir == "mine"


def test_schedule_counts_the_epochs_done_once(monkeypatch):
    """A run resumed at epoch 1 of 3 (step decay at epoch 2, 22 updates an epoch) reads the
    uninterrupted run's rates: with states that carry the update count (dist_odsgd's count
    goes on from 23), no offset; without states (dist_sync: the count starts at 1 again), the
    epoch done; with --resume auto, the offset of the checkpoint's run."""
    args = parsed(["--lr", "0.1", "--lr-decay-epoch", "2", "--num-epochs", "3"], monkeypatch)
    uninterrupted, _ = session.make_schedules(args, 22, 2)
    assert (uninterrupted(23), uninterrupted(45)) == pytest.approx((0.1, 0.01))
    args.resume_epoch, args.resume_params, args.resume_states = 1, "p", "s"
    with_states, _ = session.make_schedules(args, 22, 2, session.schedule_offset_epochs(args))
    assert [with_states(u) for u in range(23, 67)] == \
        [uninterrupted(u) for u in range(23, 67)]
    args.resume_states = ""
    without, _ = session.make_schedules(args, 22, 2, session.schedule_offset_epochs(args))
    assert [without(u) for u in range(1, 45)] == [uninterrupted(u + 22) for u in range(1, 45)]
    found = checkpoint_index.Checkpoint("c", 30, "dist_odsgd", 2,
                                        {"schedule_offset_epochs": 1}, "m")
    assert session.schedule_offset_epochs(args, found) == 1


def test_resume_refuses_a_checkpoint_of_another_run():
    run = types.SimpleNamespace(task_name="mnist", num_workers=2, batch_per_worker=32,
                                steps=22, args=types.SimpleNamespace(
                                    model="mlp", mode="imperative", seed=0, save_dir="ckpt"))
    extra = checkpoints.run_fields(run)
    found = checkpoint_index.Checkpoint("ckpt/mnist-mlp-step000000005", 5, "dist_odsgd", 2,
                                        dict(extra, batch_per_worker=64), "m")
    with pytest.raises(ValueError, match="batch_per_worker 64 \\(this run: 32\\)"):
        checkpoints.check_same_run(found, run)
    checkpoints.check_same_run(found._replace(extra=extra), run)   # the same run: no error
    # after an epoch's last batch, the next epoch's start
    saving = _with(run, schedule_offset_epochs=0, args=_with(run.args, kvstore="dist_odsgd"))
    after = checkpoints.position_extra(saving, 0, 22, [])
    assert (after["epoch"], after["batch"], after["global_step"]) == (1, 0, 22)


def _with(namespace, **fields):
    return types.SimpleNamespace(**dict(vars(namespace), **fields))


# -- real jobs ----------------------------------------------------------------------------
def load_arrays(path):
    return {name: array.asnumpy() for name, array in mx.nd.load(str(path)).items()}


def assert_bitwise_equal(path, reference):
    got, expected = load_arrays(path), load_arrays(reference)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].tobytes() == expected[name].tobytes(), (path, name)


def final_files(folder, name, step, epochs):
    """Every worker's own weights of the final checkpoint and rank 0's global weights."""
    prefix = checkpoint_index.step_prefix(str(folder), name, step)
    return ["%s-worker%d.params" % (prefix, rank) for rank in range(2)] + \
        [epoch_saves.params_path(os.path.join(str(folder), name), epochs)]


def run_interrupted(script_name, flags, save, stop, keep=2):
    """Runs the job to global step `stop` (--stop-after-steps), keeping `keep` checkpoints;
    returns the steps of the whole checkpoints left."""
    run_job(script(script_name), flags + ["--save-dir", save, "--stop-after-steps", stop,
                                          "--keep-checkpoints", keep], timeout=150)
    return [c.step for c in checkpoint_index.whole_checkpoints(str(save))]


def restarting_launcher(script_name, args, checkpoint_dir, timeout=200):
    """The script as a 2-worker job of `python -m odsgd.launch --max-restarts 1
    --checkpoint-dir DIR`, watched while it runs (tests/cluster.py: a deadline, and only the
    job's processes ended)."""
    tag = "odsgd-resume-test-%s" % uuid.uuid4().hex
    # the tag on every process's command line: in the path of the results rank 0 writes
    command = [sys.executable, "-m", "odsgd.launch", "--max-restarts", "1",
               "--checkpoint-dir", str(checkpoint_dir), "--job-timeout", str(timeout),
               "-n", "2", "-s", "1", "--launcher", "local", sys.executable,
               script(script_name)] + [str(a) for a in args] + \
        ["--json", "%s.%s.json" % (checkpoint_dir, tag)]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return WatchedLauncher(command, env, 2 * timeout, tag)


def kill_after_a_whole_checkpoint(job, checkpoint_dir, label, min_step=0, timeout=200):
    """Waits for a whole checkpoint of step >= `min_step` in `checkpoint_dir` while `job`
    (restarting_launcher's) runs, then SIGKILLs its process `label` ('worker 1', 'server 0');
    returns (that checkpoint, the pid killed, the launcher's exit code). Ends the job."""
    try:
        deadline = time.time() + timeout
        latest = None
        while time.time() < deadline and job.process.poll() is None:
            latest = checkpoint_index.latest_checkpoint(str(checkpoint_dir))
            if latest is not None and latest.step >= min_step:
                break
            time.sleep(0.05)
        assert latest is not None and latest.step >= min_step, job.output[-4000:]
        pid = job.pids()[label]
        os.kill(pid, signal.SIGKILL)
        return latest, pid, job.finish()
    finally:
        job.end()


def launch_with_restarts(script_name, args, checkpoint_dir, timeout=200):
    """Runs restarting_launcher's job to its end; returns its output. It must exit 0."""
    job = restarting_launcher(script_name, args, checkpoint_dir, timeout)
    try:
        code = job.finish()
    finally:
        job.end()
    assert code == 0, job.output[-6000:]
    return job.output


def mnist_flags(kvstore):
    """train_mnist.py --digits, 2 workers, 2 epochs of 22 steps, a checkpoint every 5 steps
    (5 does not divide 22)."""
    flags = ["--digits", "--model", "mlp", "--batch-size", 32, "--lr", 0.1, "--num-epochs", 2,
             "--kvstore", kvstore, "--save-every-steps", 5, "--log-interval", 5]
    return flags + (["--warmup-steps", 10] if kvstore == "dist_odsgd" else [])


@pytest.fixture(scope="module")
def mnist_uninterrupted(tmp_path_factory):
    """The uninterrupted run of mnist_flags(kvstore), made once per store: its folder."""
    made = {}

    def run(kvstore):
        if kvstore not in made:
            whole = tmp_path_factory.mktemp("uninterrupted_" + kvstore)
            run_job(script("train_mnist.py"), mnist_flags(kvstore) + [
                "--save-dir", whole, "--json", whole / "results.json"], timeout=150)
            made[kvstore] = whole
        return made[kvstore]
    return run


@pytest.mark.timeout(480)
@pytest.mark.parametrize("kvstore", ["dist_odsgd", "dist_sync"])
def test_mnist_resumed_mid_epoch_equals_uninterrupted(tmp_path, kvstore, mnist_uninterrupted):
    """mnist_flags' run, uninterrupted; and stopped after step 25 (keeping 2 checkpoints),
    the newest checkpoint's marker removed (a save cut short), resumed with --resume auto from
    step 20 (mid-epoch 0, the epoch's end and evaluation still ahead): the final checkpoint's
    w^0, w^1 and W are the uninterrupted run's, bit for bit, and so is the history. With
    dist_odsgd also the same through the launcher's restart after worker 0 is killed at step
    25 (the restart is the store's business, not dist_sync's or dist_odsgd's)."""
    flags = mnist_flags(kvstore)
    whole, broken = mnist_uninterrupted(kvstore), tmp_path / "resumed"
    assert run_interrupted("train_mnist.py", flags, broken, stop=25) == [20, 25]
    checkpoint_index.remove_marker(checkpoint_index.step_prefix(str(broken), "mnist-mlp", 25))
    run_job(script("train_mnist.py"), flags + ["--save-dir", broken, "--resume", "auto",
                                               "--json", broken / "results.json"], timeout=150)
    log = (broken / "train_mnist.log").read_text()
    assert "resumed from %s (global step 20): epoch 0, batch 20 of 22" % \
        checkpoint_index.step_prefix(str(broken), "mnist-mlp", 20) in log
    for got, expected in zip(final_files(broken, "mnist-mlp", 44, 2),
                             final_files(whole, "mnist-mlp", 44, 2)):
        assert_bitwise_equal(got, expected)
    resumed, uninterrupted = read_results(broken / "results.json"), \
        read_results(whole / "results.json")
    assert [h["val_top1"] for h in resumed["history"]] == \
        [h["val_top1"] for h in uninterrupted["history"]]
    assert uninterrupted["history"][-1]["val_top1"] > 0.8
    if kvstore != "dist_odsgd":
        return

    # The drill in one command: worker 0 killed after step 25 in the first attempt, the
    # launcher starts the job again, --resume auto finds the checkpoint in the launcher's
    # --checkpoint-dir (ODSGD_CHECKPOINT_DIR, no --save-dir given) and goes on.
    drilled = tmp_path / "drilled"
    output = launch_with_restarts("train_mnist.py", flags + [
        "--fail-after-steps", 25, "--resume", "auto", "--keep-checkpoints", 2], drilled)
    assert "restarting (resumes from %s, step 25)" % checkpoint_index.step_prefix(
        str(drilled), "mnist-mlp", 25) in output
    for got, expected in zip(final_files(drilled, "mnist-mlp", 44, 2),
                             final_files(whole, "mnist-mlp", 44, 2)):
        assert_bitwise_equal(got, expected)


def train_alone(script_name, flags, timeout=150):
    """Runs a script as one process (a local store), asserting exit code 0."""
    out = subprocess.run([sys.executable, script(script_name)] + [str(f) for f in flags],
                         capture_output=True, text=True, timeout=timeout, cwd=REPO,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


def test_local_store_resumed_mid_epoch_equals_uninterrupted(tmp_path):
    """--kvstore local (one process, the Trainer's states on the worker): stopped after step
    16 of 2 epochs of 11 (a checkpoint every 4 steps) and resumed, the final weights are the
    uninterrupted run's, bit for bit."""
    flags = ["--digits", "--model", "mlp", "--batch-size", 128, "--lr", 0.1, "--num-epochs",
             2, "--kvstore", "local", "--save-every-steps", 4, "--log-interval", 4]
    whole, broken = tmp_path / "uninterrupted", tmp_path / "resumed"
    train_alone("train_mnist.py", flags + ["--save-dir", whole])
    train_alone("train_mnist.py", flags + ["--save-dir", broken, "--stop-after-steps", 16])
    assert checkpoint_index.latest_checkpoint(str(broken)).extra["batch"] == 5
    train_alone("train_mnist.py", flags + ["--save-dir", broken, "--resume", "auto"])
    files = [os.path.basename(checkpoint_index.step_prefix(".", "mnist-mlp", 22)) +
             "-worker0.params", "mnist-mlp-0002.params"]
    for name in files:
        assert_bitwise_equal(broken / name, whole / name)


@pytest.mark.timeout(300)
def test_dist_async_resumes_what_it_can(tmp_path):
    """dist_async: --resume auto loads the checkpoint of step 25 and goes on to the end,
    saying in the log that the run does not replay the interrupted one."""
    flags = ["--digits", "--model", "mlp", "--batch-size", 32, "--lr", 0.05, "--num-epochs", 2,
             "--kvstore", "dist_async", "--save-every-steps", 5, "--save-dir", tmp_path]
    assert run_interrupted("train_mnist.py", flags[:-2], tmp_path, stop=25) == [20, 25]
    run_job(script("train_mnist.py"), flags + ["--resume", "auto", "--json",
                                               tmp_path / "results.json"], timeout=150)
    log = " ".join((tmp_path / "train_mnist.log").read_text().split())
    assert "resumed from %s (global step 25): epoch 1, batch 3 of 22" % \
        checkpoint_index.step_prefix(str(tmp_path), "mnist-mlp", 25) in log
    assert "with dist_async: the weights and states of the checkpoint are loaded" in log
    assert [h["epoch"] for h in read_results(tmp_path / "results.json")["history"]] == [1, 2]
    assert checkpoint_index.latest_checkpoint(str(tmp_path)).extra["global_step"] == 44


@pytest.mark.timeout(420)
def test_cifar10_synthetic_resumed_equals_uninterrupted(tmp_path):
    """train_cifar10.py --synthetic, ResNet-20 (BatchNorm's running statistics are each
    worker's own), 2 workers x 8 of 64 samples: 4 steps an epoch, 2 epochs, a checkpoint every
    3 steps; stopped after step 3 and resumed: w^0, w^1 and W at the end are the
    uninterrupted run's, bit for bit."""
    flags = ["--synthetic", "--num-training-samples", 64, "--model", "cifar_resnet20_v1",
             "--batch-size", 8, "--num-epochs", 2, "--lr", 0.05, "--kvstore", "dist_odsgd",
             "--warmup-steps", 2, "--save-every-steps", 3, "-j", 1]
    whole, broken = tmp_path / "uninterrupted", tmp_path / "resumed"
    run_job(script("train_cifar10.py"), flags + ["--save-dir", whole], timeout=200)
    assert run_interrupted("train_cifar10.py", flags, broken, stop=3) == [3]
    run_job(script("train_cifar10.py"), flags + ["--save-dir", broken, "--resume", "auto"],
            timeout=200)
    name = "cifar10-cifar_resnet20_v1"
    assert "(global step 3): epoch 0, batch 3 of 4" in (broken / "train_cifar10.log").read_text()
    for got, expected in zip(final_files(broken, name, 8, 2), final_files(whole, name, 8, 2)):
        assert_bitwise_equal(got, expected)
    running = [k for k in load_arrays(final_files(whole, name, 8, 2)[0]) if "running" in k]
    assert running   # the comparison above covered BatchNorm's statistics


def test_symbolic_resumes_at_the_newest_whole_epoch_save(tmp_path):
    """--mode symbolic --resume auto (a local store, one process): resumes at the newest
    epoch save whose marker is there, trains the epochs after it only, and starts fresh in an
    empty folder."""
    save = tmp_path / "params"
    common = [sys.executable, script("train_mnist.py"), "--digits", "--mode", "symbolic",
              "--kvstore", "local", "--batch-size", "64", "--save-frequency", "1",
              "--save-dir", str(save)]

    def train(*flags):
        out = subprocess.run(common + [str(f) for f in flags], capture_output=True, text=True,
                             timeout=150, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert out.returncode == 0, out.stderr[-3000:]
    train("--num-epochs", 2, "--resume", "auto", "--json", save / "first.json")
    assert [h["epoch"] for h in read_results(save / "first.json")["history"]] == [1, 2]
    assert "no whole epoch save in %s; training starts at epoch 0" % save in \
        (save / "train_mnist.log").read_text()
    marker = checkpoint_index.marker_path(epoch_saves.epoch_prefix(str(save / "mnist-mlp"), 2))
    with open(marker) as f:
        assert json.load(f)["files"] == ["mnist-mlp-0002.params", "mnist-mlp-0002.states",
                                         "mnist-mlp-symbol.json"]
    os.unlink(marker)                       # epoch 2's save counts as cut short
    train("--num-epochs", 3, "--resume", "auto", "--json", save / "resumed.json")
    assert [h["epoch"] for h in read_results(save / "resumed.json")["history"]] == [2, 3]
    assert "epoch 1's save in %s" % save in (save / "train_mnist.log").read_text()


@pytest.mark.timeout(300)
def test_symbolic_run_restarted_from_its_epoch_save(tmp_path):
    """Module.fit (--mode symbolic) under `odsgd.launch --max-restarts 1 --checkpoint-dir`: a
    worker killed after the first epoch's save is whole; the launcher counts that save as the
    attempt's progress and restarts, and the run goes on from it to its last epoch."""
    restarted = tmp_path / "restarted"
    flags = ["--digits", "--mode", "symbolic", "--kvstore", "dist_sync", "--batch-size", 64,
             "--num-epochs", 3, "--save-frequency", 1, "--resume", "auto"]
    job = restarting_launcher("train_mnist.py", flags, restarted)
    latest, worker, code = kill_after_a_whole_checkpoint(job, restarted, "worker 1")
    assert latest.extra["mode"] == "symbolic"
    output = job.output
    assert code == 0, output[-6000:]
    assert re.search(r"attempt 1 of 2 ended: worker 1 \(pid %d\) was killed by signal 9"
                     % worker, output), output[-6000:]
    assert re.search(r"restarting \(resumes from .*mnist-mlp-000\d, step \d+\)", output)
    assert re.search(r"--resume auto \(symbolic: at epoch boundaries\): epoch \d's save",
                     output), output[-6000:]
    assert checkpoint_index.latest_checkpoint(str(restarted)).extra["epoch"] == 3


@pytest.mark.timeout(480)
def test_mnist_restarted_after_the_server_is_killed(tmp_path, mnist_uninterrupted):
    """The server (not a worker) killed with SIGKILL mid-epoch, once a checkpoint of step 20
    or later is whole: `odsgd.launch --max-restarts 1` starts the job again, --resume auto goes
    on from the newest whole checkpoint, the launcher exits 0 and the final checkpoint's w^0,
    w^1 and W are the uninterrupted run's, bit for bit."""
    flags = mnist_flags("dist_odsgd")
    whole, restarted = mnist_uninterrupted("dist_odsgd"), tmp_path / "restarted"
    job = restarting_launcher("train_mnist.py", flags + ["--resume", "auto"], restarted)
    latest, server, code = kill_after_a_whole_checkpoint(job, restarted, "server 0", min_step=20)
    output = job.output
    assert code == 0, output[-6000:]
    assert re.search(r"attempt 1 of 2 ended: server 0 \(pid %d\) was killed by signal 9"
                     % server, output), output[-6000:]
    resumed = int(re.search(r"restarting \(resumes from .*, step (\d+)\)", output).group(1))
    assert resumed >= latest.step
    for got, expected in zip(final_files(restarted, "mnist-mlp", 44, 2),
                             final_files(whole, "mnist-mlp", 44, 2)):
        assert_bitwise_equal(got, expected)
