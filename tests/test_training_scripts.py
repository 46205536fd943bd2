"""The training scripts (examples/train_imagenet.py, train_cifar10.py, train_mnist.py) on tiny
data made here, as 2-worker jobs through odsgd.launch, and their building blocks
(odsgd.training) on their own.

Each job's checkpoint is loaded back and evaluated here, independently of the job, and must
give the accuracy the job logged: that checks that rank 0 saved the weights it evaluated
(the servers' global weights)."""
import gzip
import json
import os
import pickle
import re
import struct
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from cluster import REPO, run_job
from odsgd.training import data, options, schedule

SCRIPTS = os.path.join(REPO, "examples")
COLOURS = np.array([[220, 30, 30], [30, 220, 30], [30, 30, 220], [220, 220, 30]])


def script(name):
    return os.path.join(SCRIPTS, name)


def read_results(path):
    with open(path) as f:
        return json.load(f)


# -- tiny data sets ------------------------------------------------------------------------
def write_tiny_imagenet(folder, train=37, val=12, classes=4, size=40):
    """ImageNet-format RecordIO (.rec + .idx, JPEG records, im2rec's layout): each class a
    colour plus noise."""
    paths = {}
    for split, count, seed in (("train", train, 0), ("val", val, 1)):
        rng = np.random.RandomState(seed)
        rec, idx = str(folder / (split + ".rec")), str(folder / (split + ".idx"))
        writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
        for i in range(count):
            label = i % classes
            image = np.clip(COLOURS[label] + rng.randint(-30, 30, (size, size, 3)), 0, 255)
            header = mx.recordio.IRHeader(0, float(label), i, 0)
            writer.write_idx(i, mx.recordio.pack_img(header, image.astype(np.uint8),
                                                     quality=90, img_fmt=".jpg"))
        writer.close()
        paths[split] = (rec, idx)
    return paths


def write_tiny_cifar10(folder, per_batch=8, test=20):
    """CIFAR-10's python version (data_batch_1..5, test_batch) with random images."""
    rng = np.random.RandomState(0)
    for name, count in [("data_batch_%d" % i, per_batch) for i in range(1, 6)] + \
            [("test_batch", test)]:
        batch = {b"data": rng.randint(0, 256, (count, 3072)).astype(np.uint8),
                 b"labels": list(rng.randint(0, 10, count))}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)


def write_idx(path, array):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 0x08, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(np.uint8).tobytes())


# -- building blocks, no cluster -----------------------------------------------------------
def test_equal_steps_rule_matches_mxnet_indexed_split(tmp_path):
    """shard_sizes is MXNet's own split of an indexed .rec (num_parts/part_index), so the
    steps per epoch are the smallest shard's full batches."""
    paths = write_tiny_imagenet(tmp_path, train=10, val=1)
    rec, idx = paths["train"]
    for parts in (2, 3, 4):
        seen = []
        for part in range(parts):
            it = mx.io.ImageRecordIter(path_imgrec=rec, path_imgidx=idx, data_shape=(3, 8, 8),
                                       batch_size=1, num_parts=parts, part_index=part,
                                       round_batch=False)
            seen.append(sum(1 for _ in it))
        assert data.shard_sizes(10, parts) == seen
    assert data.shard_sizes(10, 3) == [4, 4, 2]
    assert data.steps_per_epoch(10, 3, 2) == 1
    assert data.steps_per_epoch(37, 2, 4) == 4
    with pytest.raises(ValueError, match="no full batch"):
        data.steps_per_epoch(10, 4, 2)


def test_equal_steps_wraps_a_short_shard():
    """The equal-steps wrapper stops at the agreed count and starts a short shard of an MXNet
    iterator (a .rec split by bytes) over instead of ending early; a shard of the iterators
    that can start mid-epoch always holds the count, and running short is refused (a wrap
    would break the replay of a resumed run)."""
    it = mx.io.NDArrayIter(np.arange(20).reshape(5, 1, 2, 2), np.arange(5), 2,
                           last_batch_handle="discard")
    counted = data.resized_to(it, 4)
    labels = [b.label[0].asnumpy().tolist() for b in counted]
    assert labels == [[0, 1], [2, 3], [0, 1], [2, 3]]
    counted.reset()
    assert sum(1 for _ in counted) == 4
    short = data.resized_to(data.ArrayIter(np.zeros((5, 1, 2, 2)), np.arange(5), 2,
                                           lambda b, r: b, seed=0), 4)
    with pytest.raises(RuntimeError, match="ran out after 2 of 4 batches"):
        list(short)


def test_schedule_is_gluoncv_and_loads_without_gluoncv():
    """The warm-up + cosine schedule gives GluonCV's values, and unpickles where `import
    gluoncv` is impossible (as on a parameter server)."""
    from gluoncv.utils import LRScheduler, LRSequential
    built = schedule.build_schedule(0.4, "cosine", num_epochs=5, iters_per_epoch=10,
                                    warmup_epochs=1, warmup_lr=0.01)
    reference = LRSequential([
        LRScheduler("linear", base_lr=0.01, target_lr=0.4, nepochs=1, iters_per_epoch=10),
        LRScheduler("cosine", base_lr=0.4, target_lr=0, nepochs=4, iters_per_epoch=10)])
    updates = [1, 5, 10, 11, 25, 49, 50, 80]
    expected = [reference(u) for u in updates]
    assert [built(u) for u in updates] == pytest.approx(expected)
    assert built(10) == pytest.approx(0.4) and built(1) < 0.1
    code = ("import pickle, sys\n"
            "sys.modules['gluoncv'] = None\n"          # any `import gluoncv` now fails
            "s = pickle.loads(sys.stdin.buffer.read())\n"
            "print([s(u) for u in %r])\n" % updates)
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(built),
                         capture_output=True, cwd=REPO, timeout=60,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr.decode()
    assert eval(out.stdout.decode()) == pytest.approx(expected)


def test_step_schedule_and_resume_offset():
    built = schedule.build_schedule(0.1, "step", num_epochs=10, iters_per_epoch=4,
                                    lr_decay=0.1, lr_decay_epoch=[5, 8])
    assert built(1) == pytest.approx(0.1) and built(21) == pytest.approx(0.01)
    assert built(33) == pytest.approx(0.001)
    resumed = schedule.build_schedule(0.1, "step", num_epochs=10, iters_per_epoch=4,
                                      lr_decay=0.1, lr_decay_epoch=[5, 8], offset=20)
    assert resumed(1) == pytest.approx(built(21))
    local = schedule.build_local_schedule(0.5, [2], 0.1, steps_per_epoch=3)
    assert local(3) == pytest.approx(0.5) and local(7) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="needs --local-lr"):
        schedule.build_local_schedule(None, [2], 0.1, 3)


def test_cifar10_python_and_binary_files(tmp_path):
    (tmp_path / "py").mkdir()
    write_tiny_cifar10(tmp_path / "py", per_batch=3, test=4)
    (train_x, train_y), (test_x, test_y) = data.load_cifar10(str(tmp_path / "py"))
    assert train_x.shape == (15, 3, 32, 32) and train_x.dtype == np.uint8
    assert test_x.shape == (4, 3, 32, 32) and len(train_y) == 15
    with open(tmp_path / "py" / "data_batch_2", "rb") as f:
        batch = pickle.load(f)
    np.testing.assert_array_equal(train_x[3].reshape(-1), batch[b"data"][0])
    # the binary version: label byte then 3072 image bytes per record
    (tmp_path / "bin" / "cifar-10-batches-bin").mkdir(parents=True)
    for name in data.CIFAR_TRAIN_FILES + ["test_batch"]:
        rows = np.concatenate([np.full((2, 1), 7), np.arange(2 * 3072).reshape(2, 3072) % 256],
                              axis=1).astype(np.uint8)
        rows.tofile(str(tmp_path / "bin" / "cifar-10-batches-bin" / (name + ".bin")))
    (train_x, train_y), _ = data.load_cifar10(str(tmp_path / "bin"))
    assert train_x.shape == (10, 3, 32, 32) and set(train_y) == {7}
    assert train_x[1, 0, 0, 0] == 3072 % 256
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        data.load_cifar10(str(tmp_path / "missing"))


def test_mnist_idx_files(tmp_path):
    images = np.random.RandomState(0).randint(0, 256, (6, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6))
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[:2])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(2))
    (train_x, train_y), (test_x, test_y) = data.load_mnist(str(tmp_path))
    assert train_x.shape == (6, 1, 28, 28)
    np.testing.assert_array_equal(train_x[:, 0], images)
    np.testing.assert_array_equal(test_y, [0, 1])


def test_mnist_script_refuses_without_files(tmp_path):
    out = subprocess.run([sys.executable, script("train_mnist.py"), "--kvstore", "local",
                          "--data-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 2
    assert "train-images-idx3-ubyte" in out.stderr and "--digits" in out.stderr


def test_options_refuse_what_cannot_work(monkeypatch):
    parser = options.build_parser("t", model="m")
    monkeypatch.delenv("DMLC_NUM_WORKER", raising=False)
    with pytest.raises(ValueError, match="odsgd.launch"):
        options.check_arguments(parser.parse_args([]))         # dist_odsgd, no launcher
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    for argv, message in ((["--kvstore", "dist_sync", "--local-lr", "0.1"], "only apply"),
                          (["--mode", "symbolic", "--dtype", "float16", "--num-gpus", "1"],
                           "float32 only"),
                          (["--dtype", "float16"], "needs GPUs"),
                          (["--resume-states", "x.states"], "needs --resume-params"),
                          (["--num-epochs", "2", "--resume-epoch", "2"], "larger than")):
        with pytest.raises(ValueError, match=message):
            options.check_arguments(parser.parse_args(argv))


# -- 2-worker jobs -------------------------------------------------------------------------
def evaluate_params(net, ctx, iterator):
    """top-1 accuracy of `net` over `iterator`, padding left out (independent of the job)."""
    correct = total = 0
    iterator.reset()
    for batch in iterator:
        keep = batch.data[0].shape[0] - (batch.pad or 0)
        pred = net(batch.data[0].as_in_context(ctx)).argmax(axis=1).asnumpy()[:keep]
        correct += int((pred == batch.label[0].asnumpy()[:keep]).sum())
        total += keep
    return correct / total


@pytest.mark.timeout(240)
def test_imagenet_two_workers_dist_odsgd(tmp_path):
    """train_imagenet.py on a 37-image .rec: equal steps (4 per epoch: shards of 19 and 18
    images, batch 4), OD-SGD after 2 warm-up steps with warm-up epochs and cosine decay;
    rank 0 alone logs and saves the weights, and its checkpoint holds the weights it
    evaluated; every worker saves its own OD-SGD states."""
    paths = write_tiny_imagenet(tmp_path)
    save = tmp_path / "params"
    out = run_job(script("train_imagenet.py"), [
        "--rec-train", paths["train"][0], "--rec-train-idx", paths["train"][1],
        "--rec-val", paths["val"][0], "--rec-val-idx", paths["val"][1],
        "--model", "resnet18_v1", "--input-size", 32, "--num-classes", 4, "--batch-size", 4,
        "--num-epochs", 2, "--lr", 0.05, "--lr-mode", "cosine", "--warmup-epochs", 1,
        "--kvstore", "dist_odsgd", "--warmup-steps", 2, "-j", 1, "--log-interval", 2,
        "--save-frequency", 1, "--save-dir", save, "--json", save / "results.json"],
        timeout=180)
    results = read_results(save / "results.json")
    assert results["workers"] == 2 and results["steps_per_epoch"] == 4
    assert [h["steps"] for h in results["history"]] == [4, 4]
    assert results["store"]["warmup_steps"] == 2
    assert results["history"][0]["lr"] == pytest.approx(0.05)       # end of warm-up epoch
    assert 0 <= results["history"][1]["lr"] < 0.01                   # cosine to 0
    written = set(os.listdir(save))
    expected = {"results.json", "train_imagenet.log"}
    for epoch in (1, 2):
        # global weights from rank 0; a whole checkpoint of every worker and the servers
        checkpoint = "imagenet-resnet18_v1-step%09d" % (4 * epoch)
        expected |= {"imagenet-resnet18_v1-%04d.params" % epoch,
                     checkpoint + "-worker0.params", checkpoint + "-worker1.params",
                     checkpoint + "-worker0.states", checkpoint + "-worker1.states",
                     checkpoint + "-worker0.states.servers", checkpoint + ".whole.json"}
    assert written == expected
    log = (save / "train_imagenet.log").read_text()
    assert "37 training samples, 2 workers, 4 per worker and step: 4 steps per epoch" in log
    assert len(re.findall(r"\[Epoch \d\] validation \(global weights\)", log)) == 2
    assert "worker 0 of 2" in log and "worker 1 of 2" not in log     # rank 0 only
    assert log.count("[Epoch 1] training") == 1
    assert "[Epoch 1] validation" in out

    from gluoncv.model_zoo import get_model
    net = get_model("resnet18_v1", classes=4)
    net.load_parameters(str(save / "imagenet-resnet18_v1-0002.params"), ctx=mx.cpu())
    args = options.build_parser("t").parse_args([])
    args.input_size, args.crop_ratio, args.num_workers, args.seed = 32, 0.875, 1, 0
    args.rec_train, args.rec_train_idx = paths["train"]
    args.rec_val, args.rec_val_idx = paths["val"]
    _, val = data.imagenet_iterators(args, 0, 1, 4, with_val=True)
    assert evaluate_params(net, mx.cpu(), val) == pytest.approx(
        results["history"][1]["val_top1"], abs=1e-9)


@pytest.mark.timeout(240)
def test_cifar10_two_workers_reads_the_files(tmp_path):
    """train_cifar10.py on tiny CIFAR-10 python files with dist_odsgd (local 'sgd' with its
    own rate and decay, compensation): 40 images -> 5 steps of 4 per worker and epoch."""
    (tmp_path / "cifar").mkdir()
    write_tiny_cifar10(tmp_path / "cifar")
    save = tmp_path / "params"
    run_job(script("train_cifar10.py"), [
        "--data-dir", tmp_path / "cifar", "--model", "cifar_resnet20_v1", "--batch-size", 4,
        "--num-epochs", 2, "--lr", 0.05, "--kvstore", "dist_odsgd", "--warmup-steps", 3,
        "--local-optimizer", "sgd", "--local-lr", 0.1, "--local-momentum", 0.5,
        "--local-lr-decay-epoch", 1, "--compensation", 0.5, "--compensation-mode", "adaptive",
        "-j", 1, "--save-dir", save, "--json", save / "results.json"], timeout=180)
    results = read_results(save / "results.json")
    assert results["training_samples"] == 40 and results["steps_per_epoch"] == 5
    assert results["store"]["local_optimizer"] == "sgd"
    assert results["store"]["compensation"] == 0.5
    assert results["store"]["compensation_mode"] == "adaptive"
    assert results["store"]["local_lr"] == 0.1 and results["store"]["local_momentum"] == 0.5
    assert (save / "cifar10-cifar_resnet20_v1-0002.params").exists()
    assert not (save / "cifar10-cifar_resnet20_v1-0001.params").exists()   # frequency 10
    assert "validation (global weights): top1=" in (save / "train_cifar10.log").read_text()


def digits_test_iterator():
    _, (test_x, test_y) = data.load_digits()
    return mx.io.NDArrayIter(test_x, test_y.astype(np.float32), 64, shuffle=False,
                             last_batch_handle="pad")


@pytest.mark.timeout(240)
def test_mnist_digits_learns_and_resumes(tmp_path):
    """train_mnist.py --digits with dist_odsgd: above 80% (chance 10%) after 3 epochs; the
    checkpoint gives the logged accuracy; a resumed 4th epoch starts from it (a fresh run
    scores far less after one epoch)."""
    save = tmp_path / "params"
    common = ["--digits", "--model", "mlp", "--batch-size", 32, "--lr", 0.1,
              "--kvstore", "dist_odsgd", "--warmup-steps", 10, "--log-interval", 5,
              "--save-dir", save]
    run_job(script("train_mnist.py"), common + ["--num-epochs", 3,
                                                "--json", save / "first.json"], timeout=150)
    first = read_results(save / "first.json")
    assert first["steps_per_epoch"] == 22        # 1437 digits: shards of 719 and 718, /32
    accuracies = [h["val_top1"] for h in first["history"]]
    assert accuracies[-1] > 0.8

    from odsgd.training import networks
    net = networks.mnist_net("mlp")
    net.load_parameters(str(save / "mnist-mlp-0003.params"))
    assert evaluate_params(net, mx.cpu(), digits_test_iterator()) == pytest.approx(
        accuracies[-1], abs=1e-9)

    # --resume-states takes rank 0's states of the epoch's whole checkpoint (step 3 x 22)
    run_job(script("train_mnist.py"), common + [
        "--num-epochs", 4, "--resume-epoch", 3,
        "--resume-params", save / "mnist-mlp-0003.params",
        "--resume-states", save / "mnist-mlp-step000000066-worker0.states",
        "--json", save / "resumed.json"], timeout=150)
    resumed = read_results(save / "resumed.json")
    assert [h["epoch"] for h in resumed["history"]] == [4]
    assert resumed["history"][0]["val_top1"] > max(0.8, accuracies[0] + 0.02)
    assert "[Epoch 3] validation" in (save / "train_mnist.log").read_text()


@pytest.mark.timeout(240)
def test_mnist_symbolic_module_fit(tmp_path):
    """--mode symbolic (Module.fit) with dist_odsgd: learns, saves MXNet's checkpoint format,
    and the checkpoint gives the logged accuracy."""
    save = tmp_path / "params"
    run_job(script("train_mnist.py"), [
        "--digits", "--mode", "symbolic", "--model", "mlp", "--batch-size", 32, "--lr", 0.1,
        "--num-epochs", 3, "--kvstore", "dist_odsgd", "--warmup-steps", 10,
        "--save-dir", save, "--json", save / "results.json"], timeout=150)
    results = read_results(save / "results.json")
    assert results["mode"] == "symbolic" and len(results["history"]) == 3
    accuracy = results["history"][-1]["val_top1"]
    assert accuracy > 0.8
    symbol, arg_params, aux_params = mx.model.load_checkpoint(str(save / "mnist-mlp"), 3)
    mod = mx.mod.Module(symbol, context=mx.cpu())
    test = digits_test_iterator()
    mod.bind(test.provide_data, test.provide_label, for_training=False)
    mod.set_params(arg_params, aux_params)

    def predict(x):
        mod.forward(mx.io.DataBatch([x]), is_train=False)
        return mod.get_outputs()[0]
    assert evaluate_params(predict, mx.cpu(), test) == pytest.approx(accuracy, abs=1e-9)


@pytest.mark.timeout(240)
def test_warmup_run_equals_dist_sync(tmp_path):
    """With --warmup-steps beyond the run, dist_odsgd is dist_sync: the same accuracies."""
    results = {}
    for kvstore, extra in (("dist_sync", []), ("dist_odsgd", ["--warmup-steps", 1000])):
        save = tmp_path / kvstore
        run_job(script("train_mnist.py"), [
            "--digits", "--batch-size", 32, "--num-epochs", 2, "--kvstore", kvstore,
            "--save-dir", save, "--json", save / "results.json"] + extra, timeout=150)
        results[kvstore] = [h["val_top1"] for h in read_results(save / "results.json")
                            ["history"]]
    assert results["dist_odsgd"] == results["dist_sync"]
    assert results["dist_sync"][-1] > 0.5
