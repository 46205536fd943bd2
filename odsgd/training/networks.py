"""Networks of the training scripts: GluonCV's model zoo (ImageNet and CIFAR ResNets) and the
two MNIST networks of MXNet's own image-classification example (mlp, lenet)."""
import mxnet as mx
from mxnet.gluon import nn

MNIST_NETWORKS = ("mlp", "lenet")


def model_zoo_net(name, classes, **kwargs):
    """GluonCV model zoo network `name` (e.g. resnet50_v1, resnet50_v1b, cifar_resnet20_v1)
    with `classes` outputs and random weights."""
    from gluoncv.model_zoo import get_model
    try:
        return get_model(name, classes=classes, pretrained=False, **kwargs)
    except ValueError as error:
        raise ValueError("--model %r: %s" % (name, str(error).splitlines()[0])) from None


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


def initialize(net, initializer, seed, contexts, dtype="float32"):
    """Casts to `dtype` and draws the initial weights from `seed` (the same on every worker;
    the store broadcasts rank 0's anyway). Shapes stay deferred to the first training batch,
    as in GluonCV: a forward pass in inference mode here would let MKL-DNN reorder the
    convolution weights in place, and MXNet's dist stores cannot push weights in that layout
    (the servers then abort with "init K first")."""
    if dtype != "float32":
        net.cast(dtype)
    mx.random.seed(seed)
    net.initialize(initializer, ctx=contexts)
    return net
