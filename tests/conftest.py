"""Shared by every test file: import dist_sgd from this checkout, train on synthetic data.

Tests must not depend on what a machine happens to have (MNIST downloads, Fashion-MNIST
files), so they use the synthetic dataset unless DIST_SGD_DATASET is already set; the
data-loader tests that need real files ask for them by name and skip when they are absent.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # `pytest` without `python -m` does not put the cwd on sys.path
os.environ.setdefault("DIST_SGD_DATASET", "synthetic")  # inherited by the spawned ranks too
