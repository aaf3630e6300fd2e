"""dist_sgd.sgd.data: the IDX reader, the "auto" choice and its override, synthetic data, errors."""
import gzip
import os
import shutil
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dist_sgd.sgd import data
from dist_sgd.sgd.data import DatasetNotFound, get_dataset, read_idx, synthetic
from dist_sgd.sgd.models import MLP

REAL = "/usr/share/datasets/fashion-mnist"


def write_idx(path, array, compress=True):
    """An IDX file written independently of the reader: magic, big-endian dims, values."""
    codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C,
             np.float32: 0x0D, np.float64: 0x0E}
    header = bytes([0, 0, codes[array.dtype.type], array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(raw)


def write_split(directory, n_train=12, n_test=5, seed=0, compress=True):
    """A tiny MNIST-layout dataset: the four files, compressed or not."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        suffix = ".gz" if compress else ""
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte{suffix}"), images, compress)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte{suffix}"), labels, compress)
        out[prefix] = (images, labels)
    return out


def test_read_idx_every_type_compressed_or_not(tmp_path):
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (3, 4, 5), dtype=np.uint8),
              rng.integers(-128, 128, (7,), dtype=np.int8),
              rng.integers(-30000, 30000, (2, 3), dtype=np.int16),
              rng.integers(-2**31, 2**31, (4, 2), dtype=np.int32),
              rng.standard_normal((2, 2, 2)).astype(np.float32),
              rng.standard_normal((5,)).astype(np.float64)]
    for i, array in enumerate(arrays):
        for compress in (True, False):
            path = tmp_path / f"a{i}{compress}"
            write_idx(path, array, compress)
            got = read_idx(str(path))
            assert tuple(got.shape) == array.shape
            torch.testing.assert_close(got, torch.from_numpy(array.astype(array.dtype.newbyteorder("="))))


def test_read_idx_agrees_with_torchvision(tmp_path):
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor
    images, labels = write_split(tmp_path, compress=False)["train"]
    for name, array in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels)):
        path = str(tmp_path / name)
        assert torch.equal(read_idx(path), read_sn3_pascalvincent_tensor(path))
        assert torch.equal(read_idx(path), torch.from_numpy(array))


def test_read_idx_rejects_bad_files(tmp_path):
    write_idx(tmp_path / "ok", np.zeros((4, 4), np.uint8), compress=False)
    (tmp_path / "short").write_bytes((tmp_path / "ok").read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(str(tmp_path / "short"))
    (tmp_path / "junk").write_bytes(b"PK\x03\x04 not an idx file")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(str(tmp_path / "junk"))


def test_fashion_mnist_from_a_directory_normalized_and_cached(tmp_path, monkeypatch):
    files = write_split(tmp_path / "fm")
    monkeypatch.setenv("DIST_SGD_FASHION_MNIST", str(tmp_path / "fm"))
    root = str(tmp_path / "cache")
    for train, prefix in ((True, "train"), (False, "t10k")):
        ds = get_dataset("fashion-mnist", train=train, root=root, quiet=True)
        images, labels = files[prefix]
        expected = (torch.from_numpy(images).float() / 255 - 0.2860) / 0.3530
        assert ds.name == "fashion-mnist" and str(tmp_path / "fm") in ds.source
        assert ds.images.dtype == torch.float32 and ds.labels.dtype == torch.int64
        torch.testing.assert_close(ds.images, expected.unsqueeze(1))
        assert torch.equal(ds.labels, torch.from_numpy(labels).long())
        x, y = ds[2]
        assert x.shape == (1, 28, 28) and y.item() == labels[2]
        assert os.path.exists(os.path.join(root, f"fashion-mnist-{'train' if train else 'test'}.pt"))
    # Changed files must not be served from the stale cache.
    files = write_split(tmp_path / "fm", seed=5)
    for name in os.listdir(tmp_path / "fm"):  # a coarse-mtime filesystem must see a change too
        os.utime(tmp_path / "fm" / name, (1e9, 1e9))
    ds = get_dataset("fashion-mnist", root=root, quiet=True)
    assert torch.equal(ds.labels, torch.from_numpy(files["train"][1]).long())


def test_mnist_reads_torchvision_layout_without_network(tmp_path, monkeypatch):
    files = write_split(tmp_path / "MNIST" / "raw", compress=False)  # torchvision unpacks them
    monkeypatch.setattr(data, "_probe", lambda *a: pytest.fail("no download was needed"))
    ds = get_dataset("mnist", train=False, root=str(tmp_path), quiet=True)
    expected = (torch.from_numpy(files["t10k"][0]).float() / 255 - 0.1307) / 0.3081
    assert ds.name == "mnist" and len(ds) == 5
    torch.testing.assert_close(ds.images, expected.unsqueeze(1))


def test_auto_falls_back_in_order_and_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DIST_SGD_DATASET", raising=False)
    monkeypatch.setattr(data, "_probe", lambda *a: "offline in this test")
    write_split(tmp_path / "fm")
    monkeypatch.setenv("DIST_SGD_FASHION_MNIST", str(tmp_path / "fm"))
    ds = get_dataset(root=str(tmp_path / "root"))
    line = capsys.readouterr().out.strip()
    assert ds.name == "fashion-mnist" and len(ds) == 12
    assert line.count("\n") == 0 and line.startswith("dataset: fashion-mnist (12 train images")
    assert "MNIST not available" in line and "offline in this test" in line
    # Without Fashion-MNIST files either: synthetic, with both reasons.
    monkeypatch.setenv("DIST_SGD_FASHION_MNIST", str(tmp_path / "empty"))
    monkeypatch.setattr(data, "FASHION_DIRS", ())
    ds = get_dataset(root=str(tmp_path / "root"), train=False)
    line = capsys.readouterr().out
    assert ds.name == "synthetic" and "offline in this test" in line
    assert "Fashion-MNIST not available" in line and str(tmp_path / "empty") in line


def test_env_override_and_bad_names(monkeypatch, tmp_path):
    monkeypatch.setenv("DIST_SGD_DATASET", "synthetic")
    ds = get_dataset(quiet=True)
    assert ds.name == "synthetic" and "DIST_SGD_DATASET" in ds.source
    monkeypatch.setenv("DIST_SGD_DATASET", "imagenet")
    with pytest.raises(ValueError, match="DIST_SGD_DATASET"):
        get_dataset(quiet=True)
    write_split(tmp_path / "fm")
    monkeypatch.setenv("DIST_SGD_FASHION_MNIST", str(tmp_path / "fm"))
    assert get_dataset("fashion-mnist", root=str(tmp_path), quiet=True).name == "fashion-mnist"
    with pytest.raises(ValueError, match="unknown dataset"):
        get_dataset("cifar10")


def test_missing_named_datasets_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_SGD_FASHION_MNIST", str(tmp_path / "nowhere"))
    monkeypatch.setattr(data, "FASHION_DIRS", ("/no/such/dir",))
    with pytest.raises(DatasetNotFound) as info:
        get_dataset("fashion-mnist", root=str(tmp_path), quiet=True)
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message and "/no/such/dir" in message
    assert "apt-get install dataset-fashion-mnist" in message
    monkeypatch.setattr(data, "_probe", lambda *a: "offline in this test")
    with pytest.raises(DatasetNotFound, match="MNIST.*offline in this test"):
        get_dataset("mnist", root=str(tmp_path), quiet=True)
    assert issubclass(DatasetNotFound, FileNotFoundError)


def test_probe_gives_up_quickly_on_an_unreachable_host():
    start = time.perf_counter()
    # 192.0.2.0/24 is reserved for documentation: nothing ever answers there.
    why = data._probe(["https://192.0.2.1/"], timeout=0.5)
    assert why and time.perf_counter() - start < 3


def test_synthetic_is_learnable_deterministic_and_mnist_shaped():
    train, test = synthetic(2000), synthetic(500, train=False)
    assert train.images.shape == (2000, 1, 28, 28) and train.images.dtype == torch.float32
    assert train.labels.dtype == torch.int64 and set(train.labels.tolist()) == set(range(10))
    assert abs(train.images.mean().item()) < 0.1 and abs(train.images.std().item() - 1) < 0.1
    assert torch.equal(synthetic(50, seed=3).images, synthetic(50, seed=3).images)
    assert not torch.equal(synthetic(50, seed=3).images, synthetic(50, seed=4).images)
    assert not torch.equal(synthetic(50).images, synthetic(50, train=False).images)
    assert len(synthetic(0)) == 0
    with pytest.raises(ValueError):
        synthetic(-1)
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(30):
        x, y = train[step * 64:(step + 1) * 64]
        optimizer.zero_grad()
        F.nll_loss(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(test.images).argmax(1) == test.labels).float().mean().item()
    assert accuracy > 0.8, f"synthetic data should be learnable: accuracy {accuracy:.2f}"


@pytest.mark.skipif(not os.path.isdir(REAL), reason=f"no Fashion-MNIST in {REAL} "
                    "(apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist(tmp_path):
    from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor
    train = get_dataset("fashion-mnist", root=str(tmp_path), quiet=True)
    assert train.images.shape == (60000, 1, 28, 28)
    assert torch.equal(train.labels.bincount(), torch.full((10,), 6000))
    # The hard-coded statistics are this data's: normalized, it has mean 0 and std 1.
    assert abs(train.images.mean().item()) < 1e-3 and abs(train.images.std().item() - 1) < 1e-3
    plain = tmp_path / "t10k-labels-idx1-ubyte"
    with gzip.open(os.path.join(REAL, "t10k-labels-idx1-ubyte.gz")) as f, open(plain, "wb") as g:
        shutil.copyfileobj(f, g)
    assert torch.equal(read_idx(str(plain)), read_sn3_pascalvincent_tensor(str(plain)))
