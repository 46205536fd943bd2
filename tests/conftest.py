"""Puts tests/ on sys.path so that tests import the NumPy reference (od_reference) and the
cluster helper (cluster) by name."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
