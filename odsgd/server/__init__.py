"""What the parameter servers unpickle and run: the global optimizer wrapped so that it keeps
its states per parameter and takes the workers' commands (updater), learning-rate schedules in
a form they can unpickle (schedules), and their states on disk (states).

The servers unpickle this while `import mxnet` is still running there (the server loop starts
inside it): nothing here imports the worker side, and only mxnet.optimizer, mxnet.ndarray and
mxnet.lr_scheduler of MXNet, which are ready by then."""
