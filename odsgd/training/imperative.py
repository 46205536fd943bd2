"""The gluon.Trainer training loop (--mode imperative / hybrid), as GluonCV's train_imagenet.py
runs it (label smoothing and mixup included: `Targets`), with the store's global weights
evaluated and saved after each epoch."""
import logging
import time

import mxnet as mx
from mxnet import autograd, gluon

from . import checkpoints, data, epoch_saves, networks, store

LOG = logging.getLogger("odsgd.training")


def contexts(num_gpus, first_gpu=0):
    """mx.gpu(first_gpu .. first_gpu+num_gpus-1), or [mx.cpu()] when num_gpus is 0."""
    return [mx.gpu(first_gpu + i) for i in range(num_gpus)] or [mx.cpu()]


def optimizer_params(args, schedule):
    """Settings of the global optimizer --optimizer (what the servers run)."""
    params = {"learning_rate": args.lr, "momentum": args.momentum, "wd": args.wd,
              "lr_scheduler": schedule}
    if args.dtype != "float32":
        params["multi_precision"] = True
    return params


def gradient_scale(kv, batch_per_worker):
    """The `batch_size` for trainer.step: batch x workers for synchronous stores (the global
    update averages over every worker's samples, as Module does), else the worker's batch."""
    return batch_per_worker * (kv.num_workers if store.is_synchronous(kv) else 1)


def make_trainer(net, args, kv, schedule):
    trainer = gluon.Trainer(net.collect_params(), args.optimizer,
                            optimizer_params(args, schedule),
                            kvstore=kv)
    multipliers_by_index(trainer.optimizer)
    return trainer


def multipliers_by_index(optimizer):
    """Copies the Parameters' lr_mult / wd_mult other than 1 (e.g. --no-wd's) into the
    optimizer's own multipliers, by the index the kvstore keys use.

    Why: MXNet 1.9.1 pickles the optimizer for the servers without its `param_dict`
    (Optimizer.__getstate__ in python/mxnet/optimizer/optimizer.py), so with dist_sync and
    dist_async the servers would ignore the Parameters' multipliers; `_get_lrs` / `_get_wds`
    read `lr_mult` / `wd_mult` by index when `param_dict` is empty. On the workers
    `param_dict` still comes first (the same values)."""
    for index, param in optimizer.param_dict.items():
        if param.lr_mult != 1.0:
            optimizer.lr_mult[index] = param.lr_mult
        if param.wd_mult != 1.0:
            optimizer.wd_mult[index] = param.wd_mult
    return optimizer


#: GluonCV's train_imagenet.py: --label-smoothing takes 0.1 of each target off the label
LABEL_SMOOTHING_ETA = 0.1


class Targets(object):
    """What the loss compares the outputs with, as in GluonCV's train_imagenet.py.

    Plain: the labels (sparse softmax cross-entropy). label_smoothing: one-hot targets
    1 - eta + eta/K for the label and eta/K elsewhere (eta = 0.1, K classes). mixup: each
    device's batch x is trained as lam * x + (1 - lam) * x[::-1], against the (smoothed, with
    label_smoothing) one-hot targets mixed alike; lam ~ Beta(alpha, alpha), one draw per batch
    from the stream of (seed, rank, epoch, batch) (data.stream: a run resumed at any batch
    draws what the uninterrupted run drew there), and lam = 1 in the last `mixup_off_epoch`
    epochs. The smoothed targets draw nothing.
    The training metric is GluonCV's: RMSE of the softmax against the mixed targets with
    mixup, else accuracy on the labels."""

    def __init__(self, num_classes, num_epochs, label_smoothing=False, mixup=False,
                 mixup_alpha=0.2, mixup_off_epoch=0, seed=0, rank=0):
        self.num_classes, self.num_epochs = num_classes, num_epochs
        self.eta = LABEL_SMOOTHING_ETA if label_smoothing else 0.0
        self.mixup, self.mixup_alpha, self.mixup_off_epoch = mixup, mixup_alpha, mixup_off_epoch
        self.sparse = not (label_smoothing or mixup)
        self.seed, self.rank = seed, rank

    @classmethod
    def from_args(cls, args, num_classes, rank):
        """From the recipe flags (absent in scripts without them: plain labels)."""
        return cls(num_classes, args.num_epochs,
                   label_smoothing=getattr(args, "label_smoothing", False),
                   mixup=getattr(args, "mixup", False),
                   mixup_alpha=getattr(args, "mixup_alpha", 0.2),
                   mixup_off_epoch=getattr(args, "mixup_off_epoch", 0),
                   seed=args.seed, rank=rank)

    def loss(self):
        return gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=self.sparse)

    def one_hot(self, label):
        k = self.num_classes
        return label.one_hot(k, on_value=1 - self.eta + self.eta / k, off_value=self.eta / k)

    def mixup_lambda(self, epoch, batch):
        if epoch >= self.num_epochs - self.mixup_off_epoch:
            return 1.0
        draws = data.stream(data.MIXUP, self.seed, self.rank, epoch, batch)
        return draws.beta(self.mixup_alpha, self.mixup_alpha)

    def mix(self, data, label, lam):
        """(inputs, targets) of one device's batch mixed with itself reversed."""
        return (lam * data + (1 - lam) * data[::-1],
                lam * self.one_hot(label) + (1 - lam) * self.one_hot(label[::-1]))

    def prepare(self, inputs, label, epoch, batch):
        """(inputs, targets), one per device, from the devices' inputs and labels of batch
        `batch` of `epoch`."""
        if self.mixup:
            lam = self.mixup_lambda(epoch, batch)
            mixed = [self.mix(x, y, lam) for x, y in zip(inputs, label)]
            return [m[0] for m in mixed], [m[1] for m in mixed]
        if not self.sparse:
            return inputs, [self.one_hot(y) for y in label]
        return inputs, label

    def metric(self):
        return mx.metric.RMSE() if self.mixup else mx.metric.Accuracy()

    def update_metric(self, metric, label, targets, outputs):
        outputs = [out.astype("float32", copy=False) for out in outputs]
        if self.mixup:
            metric.update(targets, [mx.nd.softmax(out) for out in outputs])
        else:
            metric.update(label, outputs)


def new_metrics(num_classes):
    """{'top1': accuracy, and 'top5' where there are more than 5 classes}."""
    metrics = {"top1": mx.metric.Accuracy()}
    if num_classes > 5:
        metrics["top5"] = mx.metric.TopKAccuracy(5)
    return metrics


def _split(batch, ctx_list, dtype):
    inputs = gluon.utils.split_and_load(batch.data[0].astype(dtype, copy=False), ctx_list,
                                        batch_axis=0, even_split=False)
    label = gluon.utils.split_and_load(batch.label[0], ctx_list, batch_axis=0,
                                       even_split=False)
    return inputs, label


class EpochSteps(object):
    """What train_epoch runs: `epoch` of the run from batch `skip` (0, or where a resumed run
    goes on), `before_batch(epoch, batch)` (None, or the seeding of random layers),
    `after_step(epoch, batches_done) -> True to stop` (None, or the run's checkpoints)."""

    def __init__(self, epoch, skip=0, before_batch=None, after_step=None):
        self.epoch, self.skip = epoch, skip
        self.before_batch, self.after_step = before_batch, after_step
        self.stopped = False


def train_epoch(net, trainer, train_iter, ctx_list, step_scale, steps, args, lr_at, targets):
    """One epoch (`steps`, an EpochSteps) over `train_iter` with the loss and inputs of
    `targets` (a Targets); returns {'train_accuracy' (or 'train_rmse' with mixup),
    'train_loss', 'time', 'samples', 'steps'}. Logs speed and the metric every --log-interval
    batches, with the global rate `lr_at(i)` at the epoch's batch i."""
    loss_fn = targets.loss()
    metric, mean_loss = targets.metric(), mx.metric.Loss()
    train_iter.start_epoch(steps.epoch, steps.skip)
    tic = interval_tic = time.time()
    samples = interval_samples = done = 0
    for i, batch in enumerate(train_iter, start=steps.skip):
        inputs, label = _split(batch, ctx_list, "float32")
        inputs, goals = targets.prepare(inputs, label, steps.epoch, i)
        if steps.before_batch is not None:
            steps.before_batch(steps.epoch, i)
        with autograd.record():
            outputs = [net(x.astype(args.dtype, copy=False)) for x in inputs]
            losses = [loss_fn(out, y.astype(args.dtype, copy=False))
                      for out, y in zip(outputs, goals)]
        autograd.backward(losses)
        trainer.step(step_scale)
        targets.update_metric(metric, label, goals, outputs)
        mean_loss.update(None, losses)
        done, samples = done + 1, samples + batch.data[0].shape[0]
        interval_samples += batch.data[0].shape[0]
        if args.log_interval and (i + 1) % args.log_interval == 0:
            LOG.info("Epoch[%d] Batch [%d]\tSpeed: %.1f samples/sec\t%s=%f\tlr=%g",
                     steps.epoch, i + 1, interval_samples / (time.time() - interval_tic),
                     metric.get()[0], metric.get()[1], lr_at(i + 1))
            interval_tic, interval_samples = time.time(), 0
        if steps.after_step is not None and steps.after_step(steps.epoch, i + 1):
            steps.stopped = True
            break
    # The epoch's time includes its last pushes and pulls; and a worker must not end the
    # script with them queued (MXNet's engine skips queued work at interpreter exit, and the
    # other workers would wait for those pushes forever).
    mx.nd.waitall()
    return {"train_" + metric.get()[0]: metric.get()[1], "train_loss": mean_loss.get()[1],
            "time": time.time() - tic, "samples": samples, "steps": done}


def random_layer_seeding(net, seed, rank):
    """before_batch for a network with random layers (Dropout): seeds MXNet's generator from
    (seed, rank, epoch, batch) before each batch's forward, so that a resumed run draws the
    masks the uninterrupted run drew; None for a network without (nothing to seed, and a
    seeding is a call on every device)."""
    if not networks.has_random_layers(net):
        return None

    def before_batch(epoch, batch):
        mx.random.seed(data.stream_seed(data.NETWORK, seed, rank, epoch, batch))
    return before_batch


def evaluate(predict, val_iter, metrics):
    """{metric name: value} of `predict(batch) -> outputs (NDArray on the CPU)` over
    `val_iter`, leaving out each batch's padding."""
    for metric in metrics.values():
        metric.reset()
    val_iter.reset()
    for batch in val_iter:
        outputs = predict(batch)
        keep = outputs.shape[0] - (batch.pad or 0)
        label = batch.label[0][:keep]
        for metric in metrics.values():
            metric.update([label], [outputs[:keep]])
    return {name: metric.get()[1] for name, metric in metrics.items()}


class EvaluationNet(object):
    """A second instance of the network for evaluation, refreshed with the trained weights.

    Why not evaluate the trained network itself: on CPU builds with MKL-DNN an inference-mode
    forward reorders convolution weights in place into MKL-DNN's layout, and dist_odsgd's
    fused local update then fails on them ("We can't generate TBlob for MKLDNN data").
    Evaluating a copy keeps the trained arrays in the default layout; and the copy can take
    the global weights W (refresh_from) while the trained network keeps this worker's own.
    `like`: the trained network, whose parameters' shapes are known, so that the copy is
    initialised (and can be saved) before its first forward. Rank 0 only."""

    def __init__(self, make_net, ctx_list, dtype, like=None):
        self.net = make_net()
        if dtype != "float32":
            self.net.cast(dtype)
        if like is not None:
            pairs = zip(self.net.collect_params().values(), like.collect_params().values())
            for target, source in pairs:
                target.shape = source.shape
        # every value is overwritten by refresh(); Zero draws nothing from MXNet's generator
        self.net.initialize(mx.init.Zero(), ctx=ctx_list)
        self.net.hybridize(static_alloc=True, static_shape=True)
        self.ctx_list, self.dtype = ctx_list, dtype

    def refresh(self, trained):
        """Copies every parameter (weights and BatchNorm statistics) of `trained`."""
        pairs = zip(trained.collect_params().values(), self.net.collect_params().values())
        for source, target in pairs:
            target.set_data(source.data())

    def refresh_from(self, trained, weights):
        """Copies `weights` ({name of a parameter of `trained`: array}, e.g.
        store.global_weights) into the matching parameters."""
        pairs = zip(trained.collect_params().values(), self.net.collect_params().values())
        for source, target in pairs:
            target.set_data(weights[source.name])

    def predict(self, batch):
        inputs, _ = _split(batch, self.ctx_list, self.dtype)
        return mx.nd.concat(*[self.net(x).astype("float32").as_in_context(mx.cpu())
                              for x in inputs], dim=0)


def epoch_report(epoch, stats, validation):
    LOG.info("[Epoch %d] training: %s loss=%f", epoch,
             " ".join("%s=%f" % (name[len("train_"):], value)
                      for name, value in sorted(stats.items())
                      if name.startswith("train_") and name != "train_loss"),
             stats["train_loss"])
    LOG.info("[Epoch %d] speed: %.1f samples/sec\ttime cost: %.3f", epoch,
             stats["samples"] / max(stats["time"], 1e-9), stats["time"])
    if validation:
        LOG.info("[Epoch %d] validation (global weights): %s", epoch,
                 " ".join("%s=%f" % item for item in sorted(validation.items())))


class GlobalModel(object):
    """Rank 0's view of the global weights W at epoch ends: evaluated on the validation data,
    and saved as PREFIX-EEEE.params (what a user loads for inference), from an EvaluationNet
    that takes W from the store (store.global_weights) without touching the trained network.

    Why: today's alternative, load_global_weights, moves rank 0's own weights w_t to W, so
    under dist_odsgd rank 0's next gradient (and with it the servers' next W) is taken at W
    instead of w_t. A run resumed after an epoch end would have to repeat that move to stay
    the interrupted run; reading W into the copy instead leaves the trajectory the same
    whether a run evaluates, saves, or was resumed, at the cost of the model's memory once
    more on rank 0 (which evaluating a copy already took)."""

    def __init__(self, run, trainer):
        self.run, self.trainer = run, trainer
        self.copy = EvaluationNet(run.make_net, run.contexts, run.args.dtype, like=run.net)
        self.fresh = False

    def epoch_ended(self):
        """W has moved on since the last refresh."""
        self.fresh = False

    def refresh(self):
        if not self.fresh:
            self.copy.refresh_from(self.run.net, store.global_weights(self.trainer, self.run.kv))
            self.fresh = True

    def validation(self):
        """{metric: value} of W on the validation data ({} without validation data)."""
        if self.run.val_iter is None:
            return {}
        self.refresh()
        return evaluate(self.copy.predict, self.run.val_iter, new_metrics(self.run.num_classes))

    def save(self, path):
        self.refresh()
        self.copy.net.save_parameters(path)
        LOG.info("saved %s (global weights)", path)


def start(run, trainer):
    """Where training starts (a checkpoints.Position): --resume auto's checkpoint, or
    --resume-epoch (with --resume-states loaded), or the start."""
    args = run.args
    if args.resume == "auto":
        return checkpoints.resume(run, trainer)
    checkpoints.prepare(trainer)
    if args.resume_states:
        epoch_saves.load_trainer_states(trainer, args.resume_states, run.rank)
    return checkpoints.Position(args.resume_epoch, 0, [])


def fit(run):
    """Trains `run.net` from the start position (see `start`) to the end of epoch
    num_epochs-1, or to --stop-after-steps; returns the history (one dict per epoch, those
    of the epochs before a resumed checkpoint included). `run` is a session.Run."""
    args = run.args
    trainer = make_trainer(run.net, args, run.kv, run.schedule)
    step_scale = gradient_scale(run.kv, run.batch_per_worker)
    # Loading states sends the optimizer to the servers before the first step, which would
    # set its gradient scale: set it first (gluon refuses a change afterwards).
    trainer.optimizer.rescale_grad = 1.0 / step_scale
    position = start(run, trainer)
    targets = Targets.from_args(args, run.num_classes, run.rank)
    run.net.hybridize(static_alloc=True, static_shape=True)
    history, began = list(position.history), time.time()
    model = GlobalModel(run, trainer) if run.rank == 0 else None
    saves = checkpoints.Saves(run, trainer, history, model)
    before_batch = random_layer_seeding(run.net, args.seed, run.rank)
    for epoch in range(position.epoch, args.num_epochs):
        steps = EpochSteps(epoch, position.batch if epoch == position.epoch else 0,
                           before_batch, saves.after_step)
        stats = train_epoch(run.net, trainer, run.train_iter, run.contexts, step_scale, steps,
                            args, lambda i, e=epoch: run.lr_at(e * run.steps + i), targets)
        if steps.stopped:
            break
        if model is not None:
            model.epoch_ended()
        validation = model.validation() if model is not None else {}
        history.append(dict(stats, epoch=epoch + 1, lr=run.lr_at((epoch + 1) * run.steps),
                            wall_time=time.time() - began,
                            **{"val_" + k: v for k, v in validation.items()}))
        epoch_report(epoch, stats, validation)
        if saves.at_epoch_end(epoch):
            break
    return history
