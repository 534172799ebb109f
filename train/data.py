"""Data sets the trainer knows: synthetic, scikit-learn's bundled digits, an image folder.

Every data set yields (train, held_out) TensorDataset-like pairs of float images in
[batch, channels, image_size, image_size] and integer labels. The held-out split does not
depend on the training seed, so runs with different seeds are evaluated on the same images.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DistributedSampler, TensorDataset

SPLIT_SEED = 1234  # fixed: the held-out split is a property of the data set, not of the run
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}


@dataclass
class DataSplits:
    train: Dataset
    held_out: Dataset | None
    num_classes: int
    in_channels: int


class ResumableSampler(DistributedSampler):
    """A DistributedSampler whose next pass can start part-way through its epoch: a resumed
    run skips the samples its checkpoint had already trained on, in the same shuffled order
    (the permutation depends only on the seed and the epoch), without loading them."""

    skip = 0

    def start_at(self, epoch: int, skip_samples: int) -> None:
        self.set_epoch(epoch)
        self.skip = skip_samples

    def __iter__(self):
        skip, self.skip = self.skip, 0  # only the pass that resumes starts late
        return itertools.islice(super().__iter__(), skip, None)


def _resize(images: torch.Tensor, image_size: int) -> torch.Tensor:
    if images.shape[-1] == image_size and images.shape[-2] == image_size:
        return images
    return F.interpolate(images, size=(image_size, image_size), mode="bilinear",
                         align_corners=False)


def _split(images: torch.Tensor, labels: torch.Tensor, held_out_fraction: float,
           num_classes: int):
    """A stratified split: every class keeps the same share in train and held-out."""
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    train_idx, test_idx = [], []
    for c in range(num_classes):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_test = int(round(len(idx) * held_out_fraction))
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    tr, te = torch.cat(train_idx).sort().values, torch.cat(test_idx).sort().values
    return (TensorDataset(images[tr], labels[tr]), TensorDataset(images[te], labels[te]))


def _digits_file() -> Path | None:
    """scikit-learn's own copy of the digits (sklearn/datasets/data/digits.csv.gz), found
    without importing scikit-learn: the import took ~0.9 s of CPU of every rank's start, and
    of every restart (benchmarks/recovery.py)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def load_digits_arrays():
    """(images 1797 x 8 x 8, labels), as sklearn.datasets.load_digits gives them: its CSV
    read directly (rows of 64 pixels and the label), else through scikit-learn."""
    import numpy as np

    path = _digits_file()
    if path is None:
        from sklearn.datasets import load_digits  # a scikit-learn that keeps it elsewhere

        bunch = load_digits()
        return bunch.images, bunch.target
    import gzip

    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)


def digits(image_size: int) -> DataSplits:
    """scikit-learn's 1,797 8x8 handwritten digits (bundled with the package, no download)."""
    pixels, target = load_digits_arrays()
    images = torch.tensor(pixels, dtype=torch.float32).unsqueeze(1) / 16.0
    images = (images - 0.5) / 0.5
    labels = torch.tensor(target, dtype=torch.long)
    train, held_out = _split(_resize(images, image_size), labels, 0.2, 10)
    return DataSplits(train, held_out, num_classes=10, in_channels=1)


class Synthetic(Dataset):
    """Class prototypes plus noise, made per index: learnable, so loss falls, costs no I/O and
    no memory (a 224 px set held in memory would take GBs per rank)."""

    def __init__(self, indices: list[int], labels: torch.Tensor, prototypes: torch.Tensor):
        self.indices, self.labels, self.prototypes = indices, labels, prototypes

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        gen = torch.Generator().manual_seed(SPLIT_SEED + index)
        label = int(self.labels[index])
        noise = torch.randn(self.prototypes.shape[1:], generator=gen)
        return self.prototypes[label] + 2.0 * noise, label


def synthetic(image_size: int, num_samples: int = 4096, num_classes: int = 10,
              channels: int = 3) -> DataSplits:
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    prototypes = torch.randn(num_classes, channels, image_size, image_size, generator=gen)
    labels = torch.randint(0, num_classes, (num_samples,), generator=gen)
    n_held = num_samples // 10
    return DataSplits(Synthetic(list(range(n_held, num_samples)), labels, prototypes),
                      Synthetic(list(range(n_held)), labels, prototypes),
                      num_classes=num_classes, in_channels=channels)


class ImageFolder(Dataset):
    """root/<class>/<image>: class names sorted alphabetically give the label ids."""

    def __init__(self, files: list[tuple[Path, int]], image_size: int):
        self.files, self.image_size = files, image_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image  # only image folders need Pillow

        path, label = self.files[i]
        with Image.open(path) as img:
            img = img.convert("RGB").resize((self.image_size, self.image_size))
            data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = data.view(self.image_size, self.image_size, 3).permute(2, 0, 1).float() / 255.0
        return (x - 0.5) / 0.5, label


def _scan(root: Path, classes: list[str]) -> list[tuple[Path, int]]:
    files = []
    for label, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                files.append((path, label))
    return files


def image_folder(root: str, image_size: int) -> DataSplits:
    """`root/train/<class>/` and `root/val/<class>/` if present, else `root/<class>/` split 90/10."""
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {root}")
    train_root = base / "train" if (base / "train").is_dir() else base
    classes = sorted(p.name for p in train_root.iterdir() if p.is_dir())
    if not classes:
        raise FileNotFoundError(f"dataset folder {root} has no class sub-folders")
    if train_root is not base:
        train = _scan(train_root, classes)
        val_root = base / "val"
        held = _scan(val_root, classes) if val_root.is_dir() else []
    else:
        everything = _scan(base, classes)
        gen = torch.Generator().manual_seed(SPLIT_SEED)
        order = torch.randperm(len(everything), generator=gen).tolist()
        n_held = len(everything) // 10
        held = [everything[i] for i in order[:n_held]]
        train = [everything[i] for i in order[n_held:]]
    if not train:
        raise FileNotFoundError(f"dataset folder {root} has no images ({sorted(IMAGE_SUFFIXES)})")
    return DataSplits(ImageFolder(train, image_size), ImageFolder(held, image_size) if held else None,
                      num_classes=len(classes), in_channels=3)


def load_dataset(name: str, image_size: int) -> DataSplits:
    if name == "digits":
        return digits(image_size)
    if name == "synthetic":
        return synthetic(image_size)
    return image_folder(name, image_size)
