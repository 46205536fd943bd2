"""GluonCV's ImageNet recipe flags in examples/train_imagenet.py (--use-rec, --mode hybrid,
--last-gamma, --no-wd, --label-smoothing, --mixup, --mixup-alpha, --mixup-off-epoch,
--lr-decay-period, --rgb-mean, --rgb-std, --use-pretrained, --batch-norm, --data-dir), each held
to what GluonCV's scripts/classification/imagenet/train_imagenet.py does, computed here
independently (NumPy closed forms, GluonCV's own model zoo), on small data made here; and
2-worker jobs through odsgd.launch with the recipe on a tiny .rec and a tiny image folder."""
import importlib.util
import os
import pickle
import re

import cv2
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from cluster import run_job
from odsgd.training import data, imperative, networks, options, symbolic
from test_training_scripts import read_results, script, write_tiny_imagenet

NO_WD = re.compile(".*beta|.*gamma|.*bias")     # GluonCV's --no-wd selection
RGB = np.array([[200, 40, 10], [10, 180, 60], [30, 70, 220]])   # one flat colour per class


def load_script():
    spec = importlib.util.spec_from_file_location("train_imagenet_script",
                                                  script("train_imagenet.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_imagenet = load_script()


# -- tiny data sets with exact pixels (PNG: lossless) --------------------------------------
def write_flat_rec(folder, size=20):
    """val.rec/.idx (and train) of flat-colour PNG images, one per class in RGB."""
    paths = []
    for split in ("train", "val"):
        rec, idx = str(folder / (split + ".rec")), str(folder / (split + ".idx"))
        writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
        for i, colour in enumerate(RGB):
            image = np.tile(colour[::-1], (size, size, 1)).astype(np.uint8)   # cv2: BGR
            header = mx.recordio.IRHeader(0, float(i), i, 0)
            writer.write_idx(i, mx.recordio.pack_img(header, image, img_fmt=".png"))
        writer.close()
        paths += [rec, idx]
    return paths


def write_image_folder(root, per_class=(5, 2), size=24, noise=True):
    """GluonCV's ImageNet layout: root/train/<class>/*.png and root/val/<class>/*.png."""
    rng = np.random.RandomState(0)
    for split, count in zip(("train", "val"), per_class):
        for label, colour in enumerate(RGB):
            folder = root / split / ("n%08d" % label)
            folder.mkdir(parents=True)
            for i in range(count):
                jitter = rng.randint(-20, 20, (size, size, 3)) * noise
                image = np.clip(colour + jitter, 0, 255).astype(np.uint8)
                cv2.imwrite(str(folder / ("%d.png" % i)), image[:, :, ::-1])
    return root


def parse(argv, monkeypatch, workers="2"):
    monkeypatch.setenv("DMLC_NUM_WORKER", workers)
    return train_imagenet.parse_args([str(a) for a in argv])


# -- the command line ----------------------------------------------------------------------
def gluoncv_commands(rec, folder):
    """GluonCV's model-zoo training commands (dmlc/web-data gluoncv/logs/classification/
    imagenet/*.sh), with --kvstore dist_odsgd added."""
    rec_flags = ["--rec-train", rec[0], "--rec-train-idx", rec[1],
                 "--rec-val", rec[2], "--rec-val-idx", rec[3]]
    common = ["--mode", "hybrid", "--lr", "0.4", "--lr-mode", "cosine", "--num-epochs", "120",
              "--batch-size", "128", "--num-gpus", "8", "-j", "60", "--warmup-epochs", "5"]
    return {
        "resnet50_v1b": rec_flags + ["--model", "resnet50_v1b"] + common + [
            "--use-rec", "--last-gamma", "--save-dir", "params_resnet50_v1b"],
        "resnet50_v1d_mixup": rec_flags + ["--model", "resnet50_v1d"] + common + [
            "--use-rec", "--dtype", "float16", "--last-gamma", "--no-wd", "--label-smoothing",
            "--mixup", "--save-dir", "p", "--logging-file", "resnet50_v1d_mixup.log"],
        "resnet50_v1b_gn": rec_flags + ["--model", "resnet50_v1b"] + common + [
            "--dtype", "float32", "--use-rec", "--last-gamma", "--no-wd", "--label-smoothing",
            "--save-dir", "p", "--logging-file", "l.log", "--use-gn"],
        # a user's command: --use-rec twice
        "issue": rec_flags + ["--use-rec", "--model", "resnet50_v1b"] + common + [
            "--dtype", "float16", "--use-rec", "--last-gamma", "--no-wd", "--label-smoothing",
            "--save-dir", "p", "--logging-file", "l.log"],
        "resnet50_v1": ["--batch-size", "64", "--num-gpus", "4", "-j", "32", "--mode", "hybrid",
                        "--num-epochs", "150", "--lr", "0.1", "--momentum", "0.9", "--wd",
                        "0.0001", "--lr-decay", "0.1", "--lr-decay-epoch", "30,60,90",
                        "--model", "resnet50_v1", "--data-dir", folder],
        "vgg16_bn": ["--batch-size", "32", "--num-gpus", "8", "-j", "64", "--mode", "hybrid",
                     "--num-epochs", "100", "--lr", "0.01", "--lr-decay", "0.1",
                     "--lr-decay-epoch", "50,80", "--model", "vgg16_bn", "--data-dir", folder],
    }


def test_parser_takes_gluoncv_model_zoo_commands(tmp_path, monkeypatch):
    rec = write_flat_rec(tmp_path)
    folder = write_image_folder(tmp_path / "imagenet", per_class=(1, 1))
    for name, argv in gluoncv_commands(rec, folder).items():
        args = parse(argv + ["--kvstore", "dist_odsgd"], monkeypatch)
        assert args.mode == "imperative", name       # hybrid: the hybridized Trainer loop
        assert args.kvstore == "dist_odsgd"
        assert args.use_rec == ("--use-rec" in argv), name
    args = parse(gluoncv_commands(rec, folder)["resnet50_v1d_mixup"] + ["--kvstore",
                                                                         "dist_odsgd"],
                 monkeypatch)
    assert (args.last_gamma, args.no_wd, args.label_smoothing, args.mixup) == (True,) * 4
    assert (args.mixup_alpha, args.mixup_off_epoch) == (0.2, 0)      # GluonCV's defaults
    assert args.dtype == "float16" and args.num_workers == 60
    assert (args.rec_train, args.rec_val_idx) == (rec[0], rec[3])
    args = parse(gluoncv_commands(rec, folder)["resnet50_v1"], monkeypatch)
    assert not args.use_rec and args.data_dir == str(folder)
    # --rec-* without --use-rec and without --data-dir: the .rec files (this script's own
    # earlier commands); --data-dir without --use-rec: the folder, as GluonCV
    assert parse(["--rec-train", rec[0], "--rec-train-idx", rec[1], "--rec-val", rec[2],
                  "--rec-val-idx", rec[3]], monkeypatch).use_rec


def test_model_arguments_as_gluoncv_passes_them():
    """GluonCV: batch_norm for vgg*, use_se for resnext*, norm_layer for --use-gn,
    last_gamma=True for --last-gamma; nothing else."""
    from gluoncv.nn import GroupNorm
    assert networks.recipe_kwargs("resnet50_v1b") == {}
    assert networks.recipe_kwargs("resnet50_v1b", last_gamma=True, use_gn=True) == \
        {"last_gamma": True, "norm_layer": GroupNorm}
    assert networks.recipe_kwargs("vgg16") == {"batch_norm": False}
    assert networks.recipe_kwargs("vgg16", batch_norm=True) == {"batch_norm": True}
    assert networks.recipe_kwargs("resnext50_32x4d", use_se=True) == {"use_se": True}
    # vgg16 with --batch-norm is GluonCV's vgg16_bn: the same layers
    net = networks.model_zoo_net("vgg16", 4, **networks.recipe_kwargs("vgg16", batch_norm=True))
    assert len(list(net.collect_params(".*gamma").keys())) == 13


def test_refused_flags_name_themselves(tmp_path, monkeypatch, capsys):
    rec = write_flat_rec(tmp_path)
    base = ["--use-rec", "--rec-train", rec[0], "--rec-train-idx", rec[1], "--rec-val", rec[2],
            "--rec-val-idx", rec[3], "--kvstore", "dist_odsgd"]
    for extra, message in (
            (["--teacher", "resnet152_v1d"], "--teacher: knowledge distillation"),
            (["--temperature", "20", "--hard-weight", "0.5"],
             "--temperature, --hard-weight: knowledge distillation"),
            (["--data-backend", "dali-gpu"], "DALI"),
            (["--mode", "symbolic", "--mixup", "--label-smoothing"],
             "--label-smoothing, --mixup: GluonCV's training loop only"),
            (["--batch-norm"], "--batch-norm adds BatchNorm to VGG models only"),
            (["--use_se"], "--use_se adds squeeze-and-excitation to ResNeXt models only"),
            (["--model", "vgg16", "--last-gamma"],
             "--model 'vgg16' takes no last_gamma argument, which --last-gamma sets"),
            (["--use-pretrained", "--num-classes", "4"], "--use-pretrained loads"),
            (["--rgb-mean", "1,2"], "--rgb-mean takes 3"),
            (["--rgb-std", "1,0,1"], "--rgb-std values must be > 0"),
            (["--mixup", "--mixup-alpha", "0"], "--mixup-alpha must be > 0"),
            (["--lr-decay-period", "-1"], "--lr-decay-period must be >= 0")):
        with pytest.raises(SystemExit) as exit_info:
            parse(base + extra, monkeypatch)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, extra
    with pytest.raises(SystemExit):
        parse(["--data-dir", tmp_path / "nothing"], monkeypatch)
    assert "has no train/ folder" in capsys.readouterr().err


def test_lr_decay_period_as_gluoncv(tmp_path, monkeypatch):
    """GluonCV: lr_decay_epoch = range(period, num_epochs, period), replacing
    --lr-decay-epoch; the schedule then decays there (after the warm-up, counted from the
    start)."""
    from gluoncv.utils import LRScheduler, LRSequential
    rec = write_flat_rec(tmp_path)
    argv = ["--use-rec", "--rec-train", rec[0], "--rec-train-idx", rec[1], "--rec-val", rec[2],
            "--rec-val-idx", rec[3], "--kvstore", "local", "--lr-decay-epoch", "5",
            "--lr-mode", "step", "--num-epochs", "30", "--warmup-epochs", "2"]
    assert parse(argv + ["--lr-decay-period", 10], monkeypatch).lr_decay_epoch == "10,20"
    assert parse(argv + ["--lr-decay-period", 7], monkeypatch).lr_decay_epoch == "7,14,21,28"
    assert parse(argv, monkeypatch).lr_decay_epoch == "5"
    args = parse(argv + ["--lr-decay-period", 10, "--lr", 0.4], monkeypatch)
    from odsgd.training import session
    built, _ = session.make_schedules(args, steps=3, num_workers=1)
    reference = LRSequential([          # built as GluonCV's train_imagenet.py builds it
        LRScheduler("linear", base_lr=0, target_lr=0.4, nepochs=2, iters_per_epoch=3),
        LRScheduler("step", base_lr=0.4, target_lr=0, nepochs=28, iters_per_epoch=3,
                    step_epoch=[e - 2 for e in range(10, 30, 10)], step_factor=0.1, power=2)])
    for update in (1, 5, 6, 7, 29, 30, 31, 59, 60, 61, 89):
        assert built(update) == pytest.approx(reference(update)), update


# -- label smoothing and mixup -------------------------------------------------------------
def numpy_targets(labels, classes, eta):
    one_hot = np.eye(classes)[labels.astype(int)]
    return (1 - eta) * one_hot + eta / classes


def test_label_smoothing_targets_and_loss():
    """GluonCV: one_hot(on_value = 1 - eta + eta/K, off_value = eta/K), eta = 0.1, and the
    dense softmax cross-entropy against them."""
    labels = np.array([0, 3, 1, 4, 2, 2], dtype=np.float32)
    targets = imperative.Targets(5, num_epochs=3, label_smoothing=True)
    data = [mx.nd.ones((3, 2)), mx.nd.ones((3, 2)) * 2]
    label = [mx.nd.array(labels[:3]), mx.nd.array(labels[3:])]
    inputs, goals = targets.prepare(data, label, epoch=0, batch=0)
    assert inputs is data and not targets.sparse
    expected = numpy_targets(labels, 5, 0.1)
    np.testing.assert_allclose(np.concatenate([g.asnumpy() for g in goals]), expected,
                               rtol=1e-6)
    assert expected[0].tolist() == pytest.approx([0.92, 0.02, 0.02, 0.02, 0.02])
    logits = np.random.RandomState(0).randn(3, 5).astype(np.float32)
    loss = targets.loss()(mx.nd.array(logits), goals[0]).asnumpy()
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(loss, -(expected[:3] * log_softmax).sum(axis=1), rtol=1e-5)
    plain = imperative.Targets(5, num_epochs=3)
    assert plain.sparse and plain.prepare(data, label, 0, 0) == (data, label)


def mixed_lambda(mixed, x):
    """The lam of lam * x + (1 - lam) * x[::-1], read back from the mixed batch."""
    differ = np.abs(x - x[::-1]) > 0.1
    return float(np.median(((mixed - x[::-1]) / np.where(differ, x - x[::-1], 1))[differ]))


def test_mixup_batches_and_targets():
    """GluonCV: per device, x -> lam x + (1-lam) x[::-1], targets lam y + (1-lam) y[::-1] of
    the (smoothed with --label-smoothing) one-hot labels; lam ~ Beta(alpha, alpha), one per
    batch, 1 in the last mixup_off_epoch epochs; a batch's lam depends on its (epoch, batch)
    alone (a resumed run draws it again), not on the draws before."""
    rng = np.random.RandomState(1)
    x = rng.rand(6, 3, 2, 2).astype(np.float32)
    y = np.array([0, 1, 2, 3, 1, 0], dtype=np.float32)
    for smoothing, eta in ((False, 0.0), (True, 0.1)):
        targets = imperative.Targets(4, num_epochs=5, label_smoothing=smoothing, mixup=True,
                                     mixup_alpha=0.4, mixup_off_epoch=2, seed=7, rank=1)
        mixed, goal = targets.mix(mx.nd.array(x), mx.nd.array(y), 0.3)
        np.testing.assert_allclose(mixed.asnumpy(), 0.3 * x + 0.7 * x[::-1], rtol=1e-6)
        np.testing.assert_allclose(goal.asnumpy(), 0.3 * numpy_targets(y, 4, eta) +
                                   0.7 * numpy_targets(y[::-1], 4, eta), rtol=1e-6)
        # two devices: each half mixed with itself reversed, one lam for the batch
        halves = [mx.nd.array(x[:3]), mx.nd.array(x[3:])]
        labels = [mx.nd.array(y[:3]), mx.nd.array(y[3:])]
        seen = {}
        for epoch, batch in [(e, b) for e in range(5) for b in range(3)]:
            inputs, goals = targets.prepare(halves, labels, epoch, batch)
            lam = mixed_lambda(inputs[0].asnumpy(), x[:3])
            assert (lam == 1.0) == (epoch >= 3)
            for part, (xs, ys) in enumerate(((x[:3], y[:3]), (x[3:], y[3:]))):
                np.testing.assert_allclose(inputs[part].asnumpy(),
                                           lam * xs + (1 - lam) * xs[::-1], rtol=1e-4,
                                           atol=1e-5)
                np.testing.assert_allclose(
                    goals[part].asnumpy(), lam * numpy_targets(ys, 4, eta) +
                    (1 - lam) * numpy_targets(ys[::-1], 4, eta), rtol=1e-4, atol=1e-5)
            seen[epoch, batch] = lam
        assert len({lam for lam in seen.values() if lam != 1.0}) == 9   # a draw per batch
        assert isinstance(targets.metric(), mx.metric.RMSE)    # GluonCV's metric for mixup
    # a new Targets asked for (epoch 2, batch 1) first draws what the one above drew there
    resumed = imperative.Targets(4, num_epochs=5, mixup=True, mixup_alpha=0.4,
                                 mixup_off_epoch=2, seed=7, rank=1)
    inputs, _ = resumed.prepare(halves, labels, 2, 1)
    assert mixed_lambda(inputs[0].asnumpy(), x[:3]) == pytest.approx(seen[2, 1], rel=1e-4)


# -- the network: --no-wd, --last-gamma, --use-pretrained ----------------------------------
def test_no_wd_on_beta_gamma_bias_reaches_the_servers():
    """--no-wd: wd_mult exactly 0 on the parameters GluonCV selects, 1 elsewhere; and the
    optimizer as the servers unpickle it (without param_dict) applies the same rates."""
    net = networks.model_zoo_net("resnet18_v1", 4, no_wd=True)
    params = net.collect_params()
    zero = {name for name in params.keys() if NO_WD.match(name)}
    assert zero and any(n.endswith("_bias") for n in zero) and \
        any(n.endswith("_gamma") for n in zero) and any(n.endswith("_beta") for n in zero)
    for name, param in params.items():
        assert param.wd_mult == (0.0 if name in zero else 1.0), name
    plain = networks.model_zoo_net("resnet18_v1", 4)
    assert all(p.wd_mult == 1.0 for p in plain.collect_params().values())

    net.initialize(mx.init.Xavier())
    args = options.build_parser("t").parse_args(["--wd", "0.01", "--kvstore", "local"])
    trainer = imperative.make_trainer(net, args, mx.kv.create("local"), None)
    server_side = pickle.loads(pickle.dumps(trainer.optimizer))
    assert server_side.param_dict == {}
    by_index = trainer.optimizer.param_dict      # the kvstore keys: index -> Parameter
    indices = sorted(by_index)
    expected = [0.0 if NO_WD.match(by_index[i].name) else 0.01 for i in indices]
    assert server_side._get_wds(indices) == pytest.approx(expected)
    assert trainer.optimizer._get_wds(indices) == pytest.approx(expected)

    # symbolic mode (Module): the symbol carries wd_mult 0 to Module's optimizer
    sym = symbolic.to_symbol(networks.model_zoo_net("resnet18_v1", 4, no_wd=True))
    names = [n for n in sym.list_arguments() if n not in ("data", "softmax_label")]
    opt = mx.optimizer.create("sgd", wd=0.01, sym=sym,
                              param_idx2name=dict(enumerate(names)))
    assert opt._get_wds(list(range(len(names)))) == pytest.approx(
        [0.0 if NO_WD.match(n) else 0.01 for n in names])


def residual_blocks(net):
    """The residual blocks of a GluonCV ResNet v1 (net.features' stages) or v1b (layer1..4)."""
    from gluoncv.model_zoo import resnet, resnetv1b
    if isinstance(net, resnetv1b.ResNetV1b):
        return [block for layer in (net.layer1, net.layer2, net.layer3, net.layer4)
                for block in layer]
    return [block for stage in net.features if isinstance(stage, gluon.nn.HybridSequential)
            for block in stage if isinstance(block, (resnet.BasicBlockV1, resnet.BottleneckV1))]


def block_gammas(block):
    """(gammas of the block's BatchNorms but the last, gamma of its last), downsample left
    out: v1 blocks keep theirs in `body`, v1b blocks as bn1..bn3."""
    from gluoncv.model_zoo import resnetv1b
    if isinstance(block, (resnetv1b.BasicBlockV1b, resnetv1b.BottleneckV1b)):
        bns = [getattr(block, name) for name in ("bn1", "bn2", "bn3") if hasattr(block, name)]
    else:
        bns = [layer for layer in block.body if isinstance(layer, gluon.nn.BatchNorm)]
    return [bn.gamma.data().asnumpy() for bn in bns[:-1]], bns[-1].gamma.data().asnumpy()


@pytest.mark.parametrize("model", ["resnet18_v1", "resnet50_v1", "resnet50_v1b"])
def test_last_gamma_zero_at_init(model):
    """--last-gamma: the last BatchNorm gamma of every residual block is 0 at init, the
    others 1, after this project's initialisation (MSRAPrelu, as GluonCV)."""
    for last_gamma in (True, False):
        net = networks.model_zoo_net(model, 4,
                                     **networks.recipe_kwargs(model, last_gamma=last_gamma))
        networks.initialize(net, mx.init.MSRAPrelu(), 0, [mx.cpu()])
        with autograd.record():      # a training forward finishes the deferred init
            net(mx.nd.ones((2, 3, 32, 32)))
        blocks = residual_blocks(net)
        assert len(blocks) >= 8
        for block in blocks:
            others, last = block_gammas(block)
            assert others and all((g == 1).all() for g in others)
            assert (last == (0 if last_gamma else 1)).all(), (model, last_gamma)


def test_last_gamma_in_symbolic_mode():
    """Module (--mode symbolic) initialises from the symbol, whose variables carry the zero
    init of the last gammas."""
    net = networks.model_zoo_net("resnet18_v1", 4, last_gamma=True)
    sym = symbolic.to_symbol(net)
    module = mx.mod.Module(sym, context=mx.cpu())
    module.bind([("data", (2, 3, 32, 32))], [("softmax_label", (2,))])
    module.init_params(mx.init.MSRAPrelu())
    arg_params, _ = module.get_params()
    for block in residual_blocks(net):
        bns = [layer for layer in block.body if isinstance(layer, gluon.nn.BatchNorm)]
        assert (arg_params[bns[-1].gamma.name].asnumpy() == 0).all()
        assert (arg_params[bns[0].gamma.name].asnumpy() == 1).all()


def test_use_pretrained_never_downloads(tmp_path, monkeypatch):
    """Missing from the local model-zoo cache: a clear error naming the file, before any
    download, and no file written there."""
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "home"))
    with pytest.raises(networks.PretrainedWeightsMissing) as error:
        networks.check_pretrained_cached("resnet50_v1b")
    message = str(error.value)
    assert os.path.join(str(tmp_path / "home"), "models", "resnet50_v1b-") in message
    assert "does not download" in message and not (tmp_path / "home").exists()
    # through GluonCV's get_model itself: its download is refused
    with pytest.raises(networks.PretrainedWeightsMissing, match="does not download"):
        networks.load_pretrained("resnet18_v1", 1000)
    assert not list((tmp_path / "home" / "models").glob("*.params"))
    assert not list((tmp_path / "home" / "models").glob("*.zip"))


def test_use_pretrained_copies_every_parameter(monkeypatch):
    """With the weights in the cache, every parameter (BatchNorm statistics included) starts
    at GluonCV's pretrained value, cast to the training dtype; a stand-in for the cached
    model here."""
    kwargs = networks.recipe_kwargs("resnet18_v1", last_gamma=True)
    source = networks.model_zoo_net("resnet18_v1", 1000, **kwargs)
    source.initialize(mx.init.Uniform(1.0))
    source(mx.nd.ones((1, 3, 32, 32)))
    for param in source.collect_params(".*running_mean|.*gamma").values():
        param.set_data(mx.nd.ones(param.shape) * 0.5)   # pretrained gammas are not 0
    seen = {}

    def cached(name, classes, **given):
        seen.update(name=name, classes=classes, kwargs=given)
        return source
    monkeypatch.setattr(networks, "load_pretrained", cached)
    net = networks.model_zoo_net("resnet18_v1", 1000, **kwargs)
    init = networks.PretrainedWeights("resnet18_v1", 1000, mx.init.MSRAPrelu(), **kwargs)
    networks.initialize(net, init, 0, [mx.cpu()])
    net(mx.nd.ones((1, 3, 32, 32)))
    assert seen == {"name": "resnet18_v1", "classes": 1000, "kwargs": kwargs}
    for target, value in zip(net.collect_params().values(), source.collect_params().values()):
        np.testing.assert_array_equal(target.data().asnumpy(), value.data().asnumpy())
    assert (residual_blocks(net)[0].body[-1].gamma.data().asnumpy() != 0).any()


# -- data: normalisation, the image folder -------------------------------------------------
def first_batch(iterator):
    iterator.reset()
    return next(iter(iterator))


@pytest.mark.parametrize("flags", [[], ["--rgb-mean", "100,110,120", "--rgb-std", "50,60,70"]])
def test_rec_normalisation(tmp_path, monkeypatch, flags):
    """.rec path: (pixel - mean) / std per RGB channel on the 0..255 scale (GluonCV's
    ImageRecordIter mean_r.. std_b), with --rgb-mean / --rgb-std or GluonCV's defaults."""
    rec = write_flat_rec(tmp_path)
    args = parse(["--use-rec", "--rec-train", rec[0], "--rec-train-idx", rec[1], "--rec-val",
                  rec[2], "--rec-val-idx", rec[3], "--input-size", 16, "-j", 1,
                  "--kvstore", "local"] + flags, monkeypatch)
    mean = np.array([100, 110, 120] if flags else [123.68, 116.779, 103.939])
    std = np.array([50, 60, 70] if flags else [58.393, 57.12, 57.375])
    _, val = data.imagenet_iterators(args, 0, 1, 3, with_val=True)
    batch = first_batch(val)
    expected = (RGB - mean) / std
    got = batch.data[0].asnumpy()
    for i in range(3):
        np.testing.assert_allclose(got[i].reshape(3, -1).T, np.tile(expected[i], (256, 1)),
                                   rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(batch.label[0].asnumpy(), [0, 1, 2])


@pytest.mark.parametrize("flags", [[], ["--rgb-mean", "100,110,120", "--rgb-std", "50,60,70"]])
def test_folder_normalisation_and_shards(tmp_path, monkeypatch, flags):
    """Image-folder path (--data-dir without --use-rec): GluonCV's Normalize on [0, 1]
    pixels (mean 0.485,0.456,0.406, std 0.229,0.224,0.225, or the flags / 255); validation
    in order, the last batch padded; training shards disjoint, full batches, all classes."""
    root = write_image_folder(tmp_path / "imagenet", per_class=(5, 2), noise=False)
    args = parse(["--data-dir", root, "--input-size", 16, "-j", 0, "--kvstore", "local"] + flags,
                 monkeypatch)
    assert not args.use_rec and train_imagenet.training_size(args) == 15
    mean = np.array([100, 110, 120]) / 255.0 if flags else np.array([0.485, 0.456, 0.406])
    std = np.array([50, 60, 70]) / 255.0 if flags else np.array([0.229, 0.224, 0.225])
    _, val = data.imagenet_folder_iterators(args, 0, 1, 4, with_val=True)
    batches = list(val)
    assert [b.pad for b in batches] == [0, 2]
    images = np.concatenate([b.data[0].asnumpy() for b in batches])[:6]
    labels = np.concatenate([b.label[0].asnumpy() for b in batches])[:6]
    np.testing.assert_array_equal(labels, [0, 0, 1, 1, 2, 2])
    expected = (RGB[labels.astype(int)] / 255.0 - mean) / std
    np.testing.assert_allclose(images.mean(axis=(2, 3)), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(images.std(axis=(2, 3)), 0, atol=1e-5)

    shards = [data.folder_shard(15, rank, 2) for rank in range(2)]
    assert [len(s) for s in shards] == data.shard_sizes(15, 2)
    assert sorted(np.concatenate(shards).tolist()) == list(range(15))
    seen = []
    for rank in range(2):
        train, _ = data.imagenet_folder_iterators(args, rank, 2, 3, with_val=False)
        epoch = [b for b in train]
        assert len(epoch) == len(shards[rank]) // 3 and all(b.pad == 0 for b in epoch)
        assert epoch[0].data[0].shape == (3, 3, 16, 16)
        seen += [label for b in epoch for label in b.label[0].asnumpy().tolist()]
    assert set(seen) == {0.0, 1.0, 2.0}


# -- 2-worker jobs with the recipe ---------------------------------------------------------
RECIPE = ["--mode", "hybrid", "--last-gamma", "--no-wd", "--label-smoothing", "--mixup",
          "--mixup-off-epoch", 1, "--model", "resnet18_v1", "--input-size", 32,
          "--batch-size", 4, "--num-epochs", 2, "--lr", 0.05, "--lr-mode", "cosine",
          "--warmup-epochs", 1, "--kvstore", "dist_odsgd", "--warmup-steps", 2, "-j", 1,
          "--log-interval", 2]


def check_recipe_job(save, classes, steps):
    results = read_results(save / "results.json")
    assert results["workers"] == 2 and results["steps_per_epoch"] == steps
    assert results["mode"] == "imperative"
    for entry in results["history"]:
        assert 0 <= entry["train_rmse"] <= 1          # GluonCV's mixup metric
        assert 0 <= entry["val_top1"] <= 1
    log = (save / "train_imagenet.log").read_text()
    assert "'last_gamma': True, 'no_wd': True, 'label_smoothing': True, 'mixup': True" in log
    assert "[Epoch 1] training: rmse=" in log
    # the checkpoint is a network of the recipe's model (last_gamma blocks)
    net = networks.model_zoo_net("resnet18_v1", classes, last_gamma=True)
    net.load_parameters(str(save / "imagenet-resnet18_v1-0002.params"), ctx=mx.cpu())
    return results


@pytest.mark.timeout(300)
def test_recipe_job_on_rec(tmp_path):
    """GluonCV's recipe flags on the 37-image .rec: 2 workers, dist_odsgd, exits 0."""
    paths = write_tiny_imagenet(tmp_path)
    save = tmp_path / "params"
    run_job(script("train_imagenet.py"), [
        "--use-rec", "--rec-train", paths["train"][0], "--rec-train-idx", paths["train"][1],
        "--rec-val", paths["val"][0], "--rec-val-idx", paths["val"][1], "--num-classes", 4,
        "--save-dir", save, "--json", save / "results.json"] + RECIPE, timeout=200)
    check_recipe_job(save, 4, steps=4)


@pytest.mark.timeout(300)
def test_recipe_job_on_image_folder(tmp_path):
    """The image-folder path (--data-dir, data-loading processes inside each worker of the
    job): 3 classes x 7 images, shards of 11 and 10, 2 steps of 4 per epoch."""
    root = write_image_folder(tmp_path / "imagenet", per_class=(7, 2))
    save = tmp_path / "params"
    run_job(script("train_imagenet.py"), [
        "--data-dir", root, "--num-classes", 3, "--save-dir", save,
        "--json", save / "results.json"] + RECIPE, timeout=200)
    check_recipe_job(save, 3, steps=2)
