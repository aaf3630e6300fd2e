"""The datasets the lessons train on: MNIST, Fashion-MNIST, or a small synthetic set.

    train = get_dataset()                 # "auto": the first that works, and it says which
    test = get_dataset(train=False)
    images, labels = train.tensors        # (N, 1, 28, 28) float32 normalized, (N,) int64

"auto" tries, in order:
  1. MNIST through torchvision (downloaded into `root` when reachable, as the classic MNIST
     example does; offline, the attempt gives up within seconds instead of hanging),
  2. Fashion-MNIST from local IDX files: $DIST_SGD_FASHION_MNIST, then
     /usr/share/datasets/fashion-mnist (Debian: `apt-get install dataset-fashion-mnist`),
  3. a small synthetic, learnable 10-class set (`synthetic()`), so nothing ever stops for data.
DIST_SGD_DATASET=mnist|fashion-mnist|synthetic overrides "auto" (the tests set "synthetic").

Everything is decoded once into memory as tensors: indexing a batch is one tensor gather, with
no per-image PIL transform. Decoded MNIST / Fashion-MNIST pixels are cached under `root`
(data/ is git-ignored), which makes every later load ~10x faster.
"""
import contextlib
import fcntl
import gzip
import os
import socket
import threading
import urllib.parse

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dist_sgd.plumbing.rank import log

NAMES = ("auto", "mnist", "fashion-mnist", "synthetic")
LABELS = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "synthetic": "synthetic"}
FASHION_DIRS = ("/usr/share/datasets/fashion-mnist",)
# Per-dataset pixel statistics of the 60,000 training images (pixels scaled to [0, 1]);
# test images are normalized with the *training* statistics, as the classic example does.
STATS = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530), "synthetic": (0.343, 0.358)}
PROBE_TIMEOUT = 5.0  # seconds to decide that MNIST's download servers are unreachable
FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# IDX type byte -> big-endian numpy dtype (the format of LeCun's MNIST files).
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DatasetNotFound(FileNotFoundError):
    """A dataset that was asked for by name is not on this machine and cannot be fetched."""


class ImageDataset(TensorDataset):
    """A TensorDataset of (image, label) with `.name` and `.source` (where, and why this one)."""

    def __init__(self, images, labels, name, source):
        super().__init__(images, labels)
        self.name, self.source = name, source

    @property
    def images(self):
        return self.tensors[0]

    @property
    def labels(self):
        return self.tensors[1]


def read_idx(path):
    """Read one IDX file (gzip-compressed or not) into a tensor.

    The format: 2 zero bytes, a type byte, the number of dimensions, then one big-endian
    int32 per dimension, then the values, big-endian, row-major.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":  # gzip's magic number: decide by content, not by file name
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'})")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    dtype = np.dtype(IDX_TYPES[raw[2]])
    offset, count = 4 + 4 * ndim, int(np.prod(dims))
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(f"{path}: header says {dims} values of {dtype.itemsize} byte(s), but "
                         f"the file holds {len(raw) - offset} bytes of data (truncated?)")
    values = np.frombuffer(raw, dtype, count=count, offset=offset)
    return torch.from_numpy(values.astype(dtype.newbyteorder("="))).reshape(dims)


def _find(directory, stem):
    # The last: torchvision's and Kaggle's naming.
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _pair_paths(directory, train):
    """[images path, labels path] of the train or test split in `directory`, or None."""
    paths = [_find(directory, stem) for stem in FILES[train]]
    return None if None in paths else paths


def _read_pair(paths):
    """(uint8 images (N, 28, 28), int labels (N,)) from an IDX images file and labels file."""
    images, labels = (read_idx(p) for p in paths)
    if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
        raise ValueError(f"{paths}: images {tuple(images.shape)} and labels "
                         f"{tuple(labels.shape)} do not form an image dataset")
    return images, labels


def _cached(root, key, sources, decode):
    """decode() once, then reuse root/<key>.pt while the source files are unchanged."""
    stamp = [(p, os.path.getsize(p), os.path.getmtime(p)) for p in sources]
    path = os.path.join(root, key + ".pt")
    with contextlib.suppress(Exception):  # a stale or broken cache is simply rebuilt
        cache = torch.load(path)
        if cache["stamp"] == stamp:
            return cache["images"], cache["labels"]
    images, labels = decode()
    with contextlib.suppress(OSError):  # a read-only root only loses the speed-up
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"  # several ranks may write at once: rename is atomic
        torch.save({"stamp": stamp, "images": images, "labels": labels}, tmp)
        os.replace(tmp, path)
    return images, labels


def _make(name, images, labels, source):
    mean, std = STATS[name]
    x = images.to(torch.float32).div_(255).sub_(mean).div_(std).unsqueeze(1)
    return ImageDataset(x, labels.to(torch.int64), name, source)


def _probe(urls, timeout):
    """None if one of the hosts answers within `timeout` seconds, else the reason why not.

    A thread, because a DNS lookup ignores socket timeouts and can hang for a long time."""
    if any(os.environ.get(v) for v in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")):
        return None  # behind a proxy the hosts are not reachable directly: just try
    errors = []

    def connect(url):
        u = urllib.parse.urlparse(url)
        try:
            socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)),
                                     timeout=timeout).close()
            errors.append(None)
        except OSError as e:
            errors.append((u.hostname, e.strerror or str(e)))

    threads = [threading.Thread(target=connect, args=(u,), daemon=True) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if None in errors:
        return None
    if not errors:
        return f"no answer within {timeout:g} s"
    hosts = {}  # one line per distinct reason: "Name or service not known (host1, host2)"
    for host, reason in errors:
        hosts.setdefault(reason, []).append(host)
    return "; ".join(f"{reason} ({', '.join(h)})" for reason, h in hosts.items())


def mnist(train=True, root="data", download=True):
    """MNIST through torchvision: use the files in root/MNIST/raw, else download them."""
    try:
        from torchvision import datasets
    except ImportError as e:  # "auto" then falls back to Fashion-MNIST or synthetic data
        raise DatasetNotFound(f"torchvision is not importable ({e}): pip install torchvision")

    raw = os.path.join(root, "MNIST", "raw")
    if _pair_paths(raw, train) is None:
        if not download:
            raise DatasetNotFound(f"not in {raw} (download disabled)")
        why = _probe(datasets.MNIST.mirrors, PROBE_TIMEOUT)
        if why:
            raise DatasetNotFound(f"not in {raw}, download failed: {why}")
        os.makedirs(root, exist_ok=True)
        old = socket.getdefaulttimeout()
        socket.setdefaulttimeout(30)  # no read may stall forever on a flaky link
        # Several ranks may start at once: one downloads, the others wait and find the files.
        with open(os.path.join(root, ".mnist.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                datasets.MNIST(root, train=train, download=True)  # fetches, checks MD5 sums
            except Exception as e:  # noqa: BLE001 - any failure means: not available
                raise DatasetNotFound(f"not in {raw}, download failed: {str(e).splitlines()[0]}")
            finally:
                socket.setdefaulttimeout(old)
    paths = _pair_paths(raw, train)
    images, labels = _cached(root, f"mnist-{'train' if train else 'test'}", paths,
                             lambda: _read_pair(paths))
    return _make("mnist", images, labels, f"torchvision MNIST in {raw}")


def fashion_mnist(train=True, root="data"):
    """Fashion-MNIST from IDX files in $DIST_SGD_FASHION_MNIST or /usr/share/datasets/..."""
    tried = []
    env = os.environ.get("DIST_SGD_FASHION_MNIST")
    for directory in ([env] if env else []) + list(FASHION_DIRS):
        paths = _pair_paths(directory, train)
        tried.append(directory)
        if paths:
            images, labels = _cached(root, f"fashion-mnist-{'train' if train else 'test'}",
                                     paths, lambda: _read_pair(paths))
            return _make("fashion-mnist", images, labels, f"IDX files in {directory}")
    raise DatasetNotFound(
        f"IDX files {', '.join(FILES[train])} (.gz or not) not found in "
        f"{' or '.join(tried)}. Get them with `apt-get install dataset-fashion-mnist` (Debian), "
        "or download them from https://github.com/zalandoresearch/fashion-mnist and set "
        "DIST_SGD_FASHION_MNIST to their directory")


def synthetic(n=None, seed=0, train=True):
    """A small learnable 10-class set shaped like MNIST: class templates plus noise.

    Each class is a fixed random blob pattern (from `seed`; the same for train and test);
    each image is its class template plus noise, clipped to [0, 1] like pixel intensities,
    and shifted by up to 2 pixels, so a model reaches high accuracy within a few dozen steps.
    """
    n = n if n is not None else (6000 if train else 1000)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(10, 1, 7, 7, generator=g)
    templates = torch.nn.functional.interpolate(coarse, size=(28, 28), mode="bilinear",
                                                align_corners=False)
    templates = ((templates - templates.mean((2, 3), keepdim=True)) * 4).clamp(0, 1)  # blobs
    g = torch.Generator().manual_seed(seed * 2 + (1 if train else 2))  # train/test: other noise
    labels = torch.randint(0, 10, (n,), generator=g)
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    pixels = (templates[labels] + 0.3 * torch.randn(n, 1, 28, 28, generator=g)).clamp(0, 1)
    for dy in range(-2, 3):  # 25 rolls of a group each, instead of one roll per image
        for dx in range(-2, 3):
            pick = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            pixels[pick] = pixels[pick].roll((dy, dx), dims=(2, 3))
    mean, std = STATS["synthetic"]
    images = (pixels - mean) / std
    source = f"generated: {n} images, 10 class templates + noise, seed {seed}"
    return ImageDataset(images.contiguous(), labels, "synthetic", source)


def get_dataset(name="auto", train=True, root="data", quiet=False):
    """The dataset `name` ("auto", "mnist", "fashion-mnist", "synthetic"); see the module doc."""
    if name not in NAMES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {NAMES}")
    why = ""
    if name == "auto" and os.environ.get("DIST_SGD_DATASET", "auto") != "auto":
        name = os.environ["DIST_SGD_DATASET"]
        if name not in NAMES:
            raise ValueError(f"DIST_SGD_DATASET={name!r} is not one of {NAMES}")
        why = f"; chosen by DIST_SGD_DATASET={name}"
    split = "train" if train else "test"
    if name == "auto":
        skipped = []
        for candidate, load in (("mnist", lambda: mnist(train, root)),
                                ("fashion-mnist", lambda: fashion_mnist(train, root))):
            try:
                dataset = load()
                break
            except DatasetNotFound as e:
                skipped.append(f"{LABELS[candidate]} not available: {e}")
        else:
            dataset = synthetic(train=train)
        why = "".join(f"; {s}" for s in skipped)
    else:
        loaders = {"mnist": lambda: mnist(train, root), "synthetic": lambda: synthetic(train=train),
                   "fashion-mnist": lambda: fashion_mnist(train, root)}
        try:
            dataset = loaders[name]()
        except DatasetNotFound as e:
            hint = (f". Run where it downloads (torchvision fetches it into {root}/MNIST/raw), "
                    "copy the four files there, or use fashion-mnist") if name == "mnist" else ""
            raise DatasetNotFound(f"{LABELS[name]} not available: {e}{hint}") from None
    dataset.source += why
    if not quiet:
        log(f"dataset: {dataset.name} ({len(dataset)} {split} images, {dataset.source})")
    return dataset
