"""The job tools: `python -m odsgd.launch` (launch, with whole-job restarts: restarts), the
ps-lite scheduler it starts (ps_scheduler) and emulated hosts on one machine (emulate). None of
them imports MXNet or the worker or server side."""
