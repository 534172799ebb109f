"""The digits the trainer reads itself (scikit-learn's CSV, without importing scikit-learn)
are the digits scikit-learn gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from train.data import digits, load_digits_arrays


def test_the_csv_read_directly_is_what_load_digits_gives():
    images, labels = load_digits_arrays()
    from sklearn.datasets import load_digits

    bunch = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert np.array_equal(images, bunch.images) and images.dtype == bunch.images.dtype
    assert np.array_equal(labels, bunch.target)
    # scikit-learn's documentation: 16 grey levels, ten classes of ~180 images each.
    assert images.min() == 0 and images.max() == 16
    assert sorted(np.bincount(labels))[0] >= 174


def test_digits_splits_all_images():
    splits = digits(8)
    assert len(splits.train) + len(splits.held_out) == 1797
    assert splits.num_classes == 10 and splits.in_channels == 1


def test_loading_the_digits_does_not_import_scikit_learn():
    """Its import was ~0.9 s of CPU at every rank's start and restart."""
    out = subprocess.run([sys.executable, "-c", "import sys; from train.data import digits; "
                          "digits(8); print('sklearn' in sys.modules)"],
                         capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"
