"""Shared by every test file: train on synthetic data.

dist_sgd is imported as an installed package (`pip install -e .`, the README's set-up) or from
the checkout (`python -m pytest` puts the current folder on sys.path).

Tests must not depend on what a machine happens to have (MNIST downloads, Fashion-MNIST
files), so they use the synthetic dataset unless DIST_SGD_DATASET is already set; the
data-loader tests that need real files ask for them by name and skip when they are absent.
"""
import os

os.environ.setdefault("DIST_SGD_DATASET", "synthetic")  # inherited by the spawned ranks too
