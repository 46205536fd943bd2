"""Building blocks of the training scripts (examples/train_imagenet.py, train_cifar10.py,
train_mnist.py): one module per concern, small functions a test can call.

    options     the command-line flags (GluonCV's names, plus the store's)
    schedule    GluonCV's warm-up + decay schedules, in a form the parameter servers can load
    store       the kvstore from the flags, and global weights for evaluation
    data        data sets, sharding by rank, the equal-steps rule, synthetic batches
    networks    GluonCV model zoo and the small MNIST networks
    logs        console and log-file logging (rank 0 only)
    epoch_saves the files saved after epochs (PREFIX-EEEE.*) and resuming from them
    imperative  the gluon.Trainer loop
    symbolic    the Module.fit path
    session     puts the above together for one task (ImageNet, CIFAR-10, MNIST)

This package imports nothing here: the parameter servers import `odsgd.training.schedule`
while `import mxnet` is still running there (see that module).
"""
