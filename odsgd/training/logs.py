"""Logging of the training scripts: rank 0 logs to the console and to a log file; the other
workers log warnings and errors only (to the console), so a job's output reads as one run."""
import logging
import os

LOG = logging.getLogger("odsgd.training")
FORMAT = "%(asctime)s %(levelname)s %(message)s"


def setup_logging(rank, log_file):
    """Configures the root logger for this worker; returns the log file path (None on ranks
    other than 0)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    console = logging.StreamHandler()
    console.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(console)
    if rank != 0:
        root.setLevel(logging.WARNING)
        return None
    root.setLevel(logging.INFO)
    folder = os.path.dirname(os.path.abspath(log_file))
    os.makedirs(folder, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(to_file)
    return log_file
