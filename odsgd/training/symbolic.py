"""The Module.fit path (--mode symbolic), the API the paper's authors trained with: the same
network as a Symbol with SoftmaxOutput, the same initial weights, store and schedule; the
global weights are evaluated and saved at the end of each epoch (epoch_end_callback), read
into copies (store.global_module_params) so that the trained Module's arrays, and with them
the run, are the same whether it evaluates or not.

Module.fit gives no point between its steps to save at: this path saves, and resumes (--resume
auto, or --resume-params/--resume-states/--resume-epoch), at epoch ends only; each epoch's data
is drawn from (seed, rank, epoch) (odsgd/training/data.py), so a run resumed at epoch e reads
what the interrupted one would have."""
import logging
import os
import time

import mxnet as mx

from . import epoch_saves, imperative, store

LOG = logging.getLogger("odsgd.training")


def to_symbol(net):
    """The network as a Symbol ending in SoftmaxOutput (label `softmax_label`)."""
    return mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")


def load_checkpoint_params(path):
    """(arg_params, aux_params) of a Module checkpoint (.params with arg:/aux: names)."""
    saved = mx.nd.load(path)
    args = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    if not args:
        raise ValueError("%s is not a Module checkpoint (no arg: entries); --mode symbolic "
                         "resumes from PREFIX-EEEE.params of a symbolic run" % path)
    return args, aux


def evaluate_module(arg_params, aux_params, symbol, contexts, val_iter, num_classes):
    """Validation metrics of the parameters `arg_params`, `aux_params` (e.g. the global
    weights), on a Module bound for inference only.

    Not the training Module: MKL-DNN would reorder its convolution weights in place (see
    imperative.EvaluationNet). A new one each time: MXNet's MKL-DNN subgraph backend, on by
    default for inference executors, keeps the weights it first saw, so an inference Module
    given new parameters with set_params would go on evaluating the old ones."""
    module = mx.mod.Module(symbol, context=contexts, logger=LOG)
    module.bind(val_iter.provide_data, val_iter.provide_label, for_training=False)
    module.set_params(arg_params, aux_params)

    def predict(batch):
        module.forward(batch, is_train=False)
        return module.get_outputs()[0].as_in_context(mx.cpu())
    return imperative.evaluate(predict, val_iter, imperative.new_metrics(num_classes))


def save(run, mod, symbol, epochs_done, params):
    """Rank 0: MXNet's checkpoint (symbol and the global weights `params`, (arg, aux)); every
    worker: its states file where the store can save states; then, once every worker has
    saved, rank 0's marker (see odsgd/training/epoch_saves.py)."""
    os.makedirs(os.path.dirname(os.path.abspath(run.prefix)), exist_ok=True)
    written = []
    if run.rank == 0:
        epoch_saves.begin_epoch_save(run.prefix, epochs_done)
        mx.model.save_checkpoint(run.prefix, epochs_done, symbol, *params)
        written += ["%s-symbol.json" % run.prefix, epoch_saves.params_path(run.prefix,
                                                                           epochs_done)]
    if store.can_save_states(run.kv):
        states = [epoch_saves.states_path(run.prefix, epochs_done, rank)
                  for rank in range(run.num_workers)]
        mod.save_optimizer_states(states[run.rank])
        written += states
    # KVStore._barrier (python/mxnet/kvstore/kvstore.py in MXNet 1.9.1; DistODSGD has its
    # own): every worker's states file is written before rank 0 calls the save whole
    run.kv._barrier()
    if run.rank == 0:
        epoch_saves.write_epoch_marker(run.prefix, epochs_done, written,
                                       epochs_done * run.steps, run.args.kvstore,
                                       run.num_workers)
        LOG.info("saved %s", ", ".join(written))


def epoch_end(run, mod, history, start):
    """epoch_end_callback: the global weights read into copies, evaluated and saved on rank 0;
    the epoch save on every worker; one history entry on every worker."""
    def callback(epoch, symbol, _arg_params, _aux_params):
        validation, params = {}, None
        due = epoch_saves.due(epoch + 1, run.args.num_epochs, run.args.save_frequency)
        if run.rank == 0 and (due or run.val_iter is not None):
            params = store.global_module_params(mod, run.kv)
        if run.rank == 0 and run.val_iter is not None:
            validation = evaluate_module(params[0], params[1], symbol, run.contexts,
                                         run.val_iter, run.num_classes)
            LOG.info("[Epoch %d] validation (global weights): %s", epoch,
                     " ".join("%s=%f" % item for item in sorted(validation.items())))
        if due:
            save(run, mod, symbol, epoch + 1, params)
        history.append(dict(epoch=epoch + 1, lr=run.lr_at((epoch + 1) * run.steps),
                            wall_time=time.time() - start,
                            **{"val_" + k: v for k, v in validation.items()}))
    return callback


def fit(run):
    """Module.fit for epochs run.args.resume_epoch .. num_epochs-1; returns the history."""
    args = run.args
    symbol = to_symbol(run.net)
    arg_params, aux_params = None, None
    if args.resume_params:
        arg_params, aux_params = load_checkpoint_params(args.resume_params)
    mx.random.seed(args.seed)   # Module draws the initial weights (same on every worker)
    mod = mx.mod.Module(symbol, context=run.contexts, logger=LOG)
    opt_params = imperative.optimizer_params(args, run.schedule)
    if args.resume_states:
        # Module.fit cannot load optimizer states: set everything up first, load them; fit
        # then finds the module bound and initialised (and says so in warnings).
        mod.bind(run.train_iter.provide_data, run.train_iter.provide_label)
        mod.init_params(run.initializer, arg_params=arg_params, aux_params=aux_params)
        mod.init_optimizer(kvstore=run.kv, optimizer=args.optimizer, optimizer_params=opt_params)
        mod.load_optimizer_states(epoch_saves.resume_states_path(args.resume_states, run.rank))
    history, start = [], time.time()
    run.train_iter.start_epoch(args.resume_epoch)   # fit's reset() goes on to the next ones
    mod.fit(run.train_iter, kvstore=run.kv, optimizer=args.optimizer, optimizer_params=opt_params,
            initializer=run.initializer, arg_params=arg_params, aux_params=aux_params,
            allow_missing=False,
            eval_metric=mx.metric.Accuracy(), begin_epoch=args.resume_epoch,
            num_epoch=args.num_epochs,
            batch_end_callback=mx.callback.Speedometer(run.batch_per_worker,
                                                       max(1, args.log_interval)),
            epoch_end_callback=epoch_end(run, mod, history, start))
    # Finish every queued push and pull before the script ends: at interpreter exit MXNet's
    # engine shuts down and skips what is still queued, and a worker whose last pushes are
    # skipped leaves the others waiting for that step forever.
    mx.nd.waitall()
    return history
