"""Puts tests/ on sys.path so that tests import the NumPy reference (od_reference) and the
cluster helper (cluster) by name."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_sessionstart(session):
    """Emulated clusters whose makers no longer run (a run of the tests killed by SIGKILL,
    or the machine's session ended under it) are torn down first: their namespaces would
    otherwise be taken for leftovers of the tests that check for them."""
    if os.geteuid() != 0:
        return
    from odsgd.cluster import emulate
    removed = emulate.remove_orphans()
    if removed:
        print("\nremoved %d orphans of emulated clusters that ended without tearing down:\n  %s"
              % (len(removed), "\n  ".join(removed)))
