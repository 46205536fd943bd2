"""Networks of the training scripts: GluonCV's model zoo (ImageNet and CIFAR ResNets) and the
two MNIST networks of MXNet's own image-classification example (mlp, lenet); and what GluonCV's
train_imagenet.py does to the model-zoo network: its model keyword arguments (--last-gamma,
--batch-norm, --use_se, --use-gn), no weight decay on biases and BatchNorm (--no-wd) and
pretrained weights from the local model-zoo cache (--use-pretrained)."""
import contextlib
import os
import re

import mxnet as mx
from mxnet.gluon import nn

MNIST_NETWORKS = ("mlp", "lenet")

#: the flags of GluonCV's train_imagenet.py that set model arguments (recipe_kwargs)
ARGUMENT_FLAGS = {"last_gamma": "--last-gamma", "batch_norm": "--batch-norm",
                  "use_se": "--use_se", "norm_layer": "--use-gn"}

#: GluonCV's train_imagenet.py --no-wd: the parameters that get wd_mult 0 (selected with
#: net.collect_params(NO_WD_PATTERN), as GluonCV does)
NO_WD_PATTERN = ".*beta|.*gamma|.*bias"


def model_zoo_net(name, classes, no_wd=False, **kwargs):
    """GluonCV model zoo network `name` (e.g. resnet50_v1, resnet50_v1b, cifar_resnet20_v1)
    with `classes` outputs and random weights; `kwargs` go to the model (see recipe_kwargs);
    no_wd: weight decay off on biases and BatchNorm (no_weight_decay)."""
    from gluoncv.model_zoo import get_model
    try:
        net = get_model(name, classes=classes, pretrained=False, **kwargs)
    except ValueError as error:
        raise ValueError("--model %r: %s" % (name, str(error).splitlines()[0])) from None
    except TypeError as error:
        # a model that takes no such argument: HybridBlock.__init__() got an unexpected ...
        found = re.search(r"argument '(\w+)'", str(error))
        argument = found.group(1) if found else "?"
        raise ValueError("--model %r takes no %s argument, which %s sets (%s); drop that flag"
                         % (name, argument, ARGUMENT_FLAGS.get(argument, "a flag"),
                            error)) from None
    if no_wd:
        no_weight_decay(net)
    return net


def recipe_kwargs(model, last_gamma=False, batch_norm=False, use_se=False, use_gn=False):
    """The model keyword arguments GluonCV's train_imagenet.py passes to get_model for its
    flags: last_gamma=True (--last-gamma: the last BatchNorm of each residual block starts
    with gamma 0), batch_norm (--batch-norm, VGG models only), use_se (--use_se, ResNeXt
    models only), norm_layer=gluoncv.nn.GroupNorm (--use-gn)."""
    kwargs = {}
    if model.startswith("vgg"):
        kwargs["batch_norm"] = batch_norm
    elif batch_norm:
        raise ValueError("--batch-norm adds BatchNorm to VGG models only (GluonCV passes it "
                         "to vgg* models); drop it for --model %s" % model)
    if model.startswith("resnext"):
        kwargs["use_se"] = use_se
    elif use_se:
        raise ValueError("--use_se adds squeeze-and-excitation to ResNeXt models only "
                         "(GluonCV passes it to resnext* models; se_resnext* have it "
                         "built in); drop it for --model %s" % model)
    if use_gn:
        from gluoncv.nn import GroupNorm
        kwargs["norm_layer"] = GroupNorm
    if last_gamma:
        kwargs["last_gamma"] = True
    return kwargs


def no_weight_decay(net):
    """GluonCV's --no-wd: wd_mult 0 on every parameter whose name matches NO_WD_PATTERN
    (biases, BatchNorm's beta and gamma). Returns their names."""
    selected = net.collect_params(NO_WD_PATTERN)
    for param in selected.values():
        param.wd_mult = 0.0
    return sorted(selected.keys())


def mlp(classes=10, hidden=(128, 64)):
    """MXNet example's MLP: Dense 128 relu, Dense 64 relu, Dense classes (flattens input)."""
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        for units in hidden:
            net.add(nn.Dense(units, activation="relu"))
        net.add(nn.Dense(classes))
    return net


def lenet(classes=10):
    """MXNet example's LeNet (5x5 convolutions with 20 and 50 filters, tanh, max pooling,
    Dense 500), with the convolutions padded so it also takes 8x8 digits."""
    net = nn.HybridSequential(prefix="lenet_")
    with net.name_scope():
        net.add(nn.Conv2D(20, 5, padding=2, activation="tanh"), nn.MaxPool2D(2, 2),
                nn.Conv2D(50, 5, padding=2, activation="tanh"), nn.MaxPool2D(2, 2),
                nn.Flatten(), nn.Dense(500, activation="tanh"), nn.Dense(classes))
    return net


def mnist_net(name, classes=10):
    if name == "mlp":
        return mlp(classes)
    if name == "lenet":
        return lenet(classes)
    raise ValueError("--model must be one of %s for MNIST, got %r" % (MNIST_NETWORKS, name))


# -- pretrained weights (--use-pretrained) -------------------------------------------------
class PretrainedWeightsMissing(RuntimeError):
    pass


def model_zoo_cache():
    """GluonCV's folder of pretrained weights (its get_model_file's default root)."""
    if "MXNET_HOME" in os.environ:
        return os.path.join(os.environ["MXNET_HOME"], "models")
    return os.path.expanduser(os.path.join("~", ".mxnet", "models"))


def _missing(params, source, name="NAME"):
    return PretrainedWeightsMissing(
        "--use-pretrained: GluonCV's pretrained weights %s are not in the local model-zoo "
        "cache (or fail its sha1 check), and this script does not download them (from %s). "
        "Copy the file there (on a machine with internet access, `python -c \"import gluoncv; "
        "gluoncv.model_zoo.get_model('%s', pretrained=True)\"` stores it in ~/.mxnet/models; "
        "MXNET_HOME moves that folder), or train without --use-pretrained"
        % (params, source, name))


@contextlib.contextmanager
def _no_downloads():
    """GluonCV's model store with its download replaced by a clear error: its weights are
    used where they are in the local cache (checked by sha1, as GluonCV does), never fetched."""
    from gluoncv.model_zoo import model_store

    def refuse(url, path=None, **_kwargs):
        raise _missing(os.path.splitext(path)[0] + ".params" if path else "", url)
    original = model_store.download
    model_store.download = refuse
    try:
        yield
    finally:
        model_store.download = original


def check_pretrained_cached(name):
    """Raises PretrainedWeightsMissing, before any job starts, when GluonCV's pretrained file
    for model `name` is not in the local cache (model_zoo_cache). Models whose file GluonCV
    names otherwise are checked when loaded (load_pretrained)."""
    from gluoncv.model_zoo import model_store
    if name not in model_store.pretrained_model_list():
        return
    params = os.path.join(model_zoo_cache(),
                          "%s-%s.params" % (name, model_store.short_hash(name)))
    if not os.path.exists(params):
        raise _missing(params, "GluonCV's model zoo", name)
    with _no_downloads():
        model_store.get_model_file(name)   # its sha1 check


def load_pretrained(name, classes, **kwargs):
    """GluonCV's pretrained network `name` (get_model(..., pretrained=True)) from the local
    model-zoo cache; raises PretrainedWeightsMissing instead of downloading."""
    from gluoncv.model_zoo import get_model
    with _no_downloads():
        try:
            return get_model(name, classes=classes, pretrained=True, **kwargs)
        except ValueError as error:   # e.g. "Pretrained model for X is not available."
            raise ValueError("--use-pretrained --model %r: %s"
                             % (name, str(error).splitlines()[0])) from None


class PretrainedWeights(mx.init.Initializer):
    """Initial weights from GluonCV's pretrained model (--use-pretrained): what `initialize`
    gives a network when handed this "initializer". Parameters the pretrained model lacks
    would take `fallback` (a model-zoo network has none such).

    model, classes, kwargs : as for model_zoo_net (the same model, the same arguments)."""

    def __init__(self, model, classes, fallback, **kwargs):
        super(PretrainedWeights, self).__init__()
        self.model, self.classes, self.kwargs = model, classes, kwargs
        self.fallback = fallback

    def __call__(self, desc, arr):
        self.fallback(desc, arr)

    def _init_weight(self, name, arr):
        raise NotImplementedError("PretrainedWeights initialises through initialize()")

    def copy_into(self, net):
        """Every parameter of `net` (weights and BatchNorm statistics) from the pretrained
        model, matched by its name within the network, cast to the parameter's dtype."""
        source = load_pretrained(self.model, self.classes, **self.kwargs)
        targets, values = net.collect_params().values(), source.collect_params().values()
        if len(targets) != len(values):
            raise ValueError("--use-pretrained: the network has %d parameters, the pretrained "
                             "model %d" % (len(targets), len(values)))
        for target, value in zip(targets, values):
            if target.name[len(net.prefix):] != value.name[len(source.prefix):]:
                raise ValueError("--use-pretrained: parameter %s of the network does not match "
                                 "%s of the pretrained model" % (target.name, value.name))
            target.set_data(value.data().astype(target.dtype))
        return len(targets)


def initialize(net, initializer, seed, contexts, dtype="float32"):
    """Casts to `dtype` and draws the initial weights from `seed` (the same on every worker;
    the store broadcasts rank 0's anyway); a PretrainedWeights initializer then loads
    GluonCV's pretrained weights into them. Shapes stay deferred to the first training batch,
    as in GluonCV: a forward pass in inference mode here would let MKL-DNN reorder the
    convolution weights in place, and MXNet's dist stores cannot push weights in that layout
    (the servers then abort with "init K first")."""
    if dtype != "float32":
        net.cast(dtype)
    mx.random.seed(seed)
    if isinstance(initializer, PretrainedWeights):
        net.initialize(initializer.fallback, ctx=contexts)
        initializer.copy_into(net)
    else:
        net.initialize(initializer, ctx=contexts)
    return net


def finish_initialization(net, data_shape, contexts, dtype="float32"):
    """Gives every parameter of `net` (initialised with deferred shapes) its shape from an
    input of `data_shape` and draws its initial values now, without a forward pass: before
    the first batch is read, so that the draws come from --seed's generator whatever the
    data loading draws (the image folder's loader seeds MXNet's generator per sample), and so
    that a checkpoint can be loaded into the parameters before the first step.

    No forward: a training forward would move BatchNorm's running statistics, an inference
    forward would let MKL-DNN reorder convolution weights in place (see `initialize`).
    `infer_shape` traces the network symbolically and sets the shapes; Parameter's
    `_finish_deferred_init` (gluon/parameter.py in MXNet 1.9.1) is what the first forward
    calls to draw the values (or take ones set while deferred, as --use-pretrained's), here
    in the order of collect_params."""
    net.infer_shape(mx.nd.zeros(data_shape, ctx=contexts[0], dtype=dtype))
    for param in net.collect_params().values():
        param._finish_deferred_init()
    return net


def has_random_layers(net):
    """Whether `net` holds Dropout layers (VGG, AlexNet, SqueezeNet, ...), whose masks come
    from MXNet's generator."""
    found = []
    net.apply(lambda block: found.append(block) if isinstance(block, nn.Dropout) else None)
    return bool(found)
