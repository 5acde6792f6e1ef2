"""Where the public data sets come from (``vitlab.data.datasets.data_dir``, ``cifar_places``, ``fetch_cifar``, ``vitlab data``)
on a machine without them, and the suite's promise that no test reaches the network (``conftest._no_network``)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import pickle
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _reference import make_folder
from torchvision.datasets import CIFAR10

import vitlab.data.datasets
from vitlab.cli import main
from vitlab.data.datasets import (
    DataError,
    DatasetMissing,
    cache_dir,
    cifar_places,
    data_dir,
    fetch_cifar,
    find_cifar,
    load_cifar,
    load_dataset,
)

TESTS = Path(__file__).resolve().parent


def test_the_data_folder_is_vitlab_data_else_the_cache_roots_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_DATA", "~/sets")
    assert data_dir() == Path.home() / "sets"
    monkeypatch.setenv("VITLAB_DATA", "")  # set but empty: unset, never the working directory
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    assert data_dir() == cache_dir() / "datasets" == tmp_path / "cache" / "datasets"
    assert cifar_places("cifar10") == [tmp_path / "cache" / "datasets" / "cifar10", vitlab.data.datasets.SHARED_CIFAR10]
    assert cifar_places("cifar100") == [tmp_path / "cache" / "datasets" / "cifar100"]  # no shared copy of it
    with pytest.raises(DataError, match="unknown dataset 'mnist'"):
        find_cifar("mnist")


def test_cifar10_is_read_from_the_data_folder_before_the_shared_copy(no_cifar):
    shared = vitlab.data.datasets.SHARED_CIFAR10
    for split in ("train", "test"):
        make_folder(shared / split, n_per_class=2, size=8, classes=("x", "y"))
    make_folder(no_cifar / "cifar10" / "test", n_per_class=3, size=8, classes=("a", "b"))
    with zipfile.ZipFile(no_cifar / "cifar10" / "train.zip", "w") as zf:  # the zips take precedence over a folder
        for f in sorted((no_cifar / "cifar10" / "test").rglob("*.png")):
            zf.write(f, f.relative_to(no_cifar / "cifar10" / "test").as_posix())
    assert find_cifar("cifar10", "train") == no_cifar / "cifar10" / "train.zip"
    test = load_dataset("cifar10", "test")
    assert test.classes == ("a", "b") and len(test) == 6
    assert load_cifar("cifar10", "train", download=False).classes == ("a", "b")
    (no_cifar / "cifar10" / "train.zip").unlink()  # the data folder lacks the split: the shared copy serves it
    assert find_cifar("cifar10", "train") == shared / "train"
    assert load_cifar("cifar10", "train", download=False).classes == ("x", "y")


def test_missing_cifar10_is_refused_naming_the_places_and_the_command(no_cifar):
    with pytest.raises(DatasetMissing) as err:
        load_cifar("cifar10", "test", download=False)
    e = err.value
    assert isinstance(e, DataError)  # callers that catch DataError keep working
    assert (e.dataset, e.looked_in, e.cause) == ("cifar10", (str(no_cifar / "cifar10"), str(vitlab.data.datasets.SHARED_CIFAR10)),
                                                 None)
    assert "`vitlab data cifar10`" in e.fix and str(no_cifar / "cifar10") in e.fix
    again = pickle.loads(pickle.dumps(e))  # a worker process re-raises it whole
    assert (again.dataset, again.looked_in, again.fix, again.cause) == (e.dataset, e.looked_in, e.fix, e.cause)
    assert not no_cifar.exists()  # looking made no folder


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def cifar_server(tmp_path, monkeypatch):
    """torchvision's CIFAR-10 downloader pointed at a small archive of torchvision's own format (20 training and 10
    test images, 10 classes) served on 127.0.0.1, with the archive's and files' MD5s: the real download, check and
    extraction, offline. Yields the list of the paths requested."""
    src = tmp_path / "served" / "cifar-10-batches-py"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 20), ("test_batch", 10)):
        batch = {"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), "labels": [i % 10 for i in range(n)]}
        (src / name).write_bytes(pickle.dumps(batch))
    (src / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
    archive = tmp_path / "served" / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=archive.parent))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(CIFAR10, "url", f"http://127.0.0.1:{server.server_address[1]}/{archive.name}")
    monkeypatch.setattr(CIFAR10, "tgz_md5", _md5(archive))
    monkeypatch.setattr(CIFAR10, "train_list", [["data_batch_1", _md5(src / "data_batch_1")]])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", _md5(src / "test_batch")]])
    monkeypatch.setattr(CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names",
                                          "md5": _md5(src / "batches.meta")})
    try:
        yield requested
    finally:
        server.shutdown()
        server.server_close()


def test_vitlab_data_cifar10_downloads_into_the_data_folder_once(no_cifar, cifar_server, capsys):
    assert main(["data", "cifar10"]) == 0
    assert capsys.readouterr().out == f"cifar10: downloaded into {no_cifar / 'cifar10'}\n"
    assert any(p.endswith("cifar-10-python.tar.gz") for p in cifar_server)
    assert find_cifar("cifar10", "test") == no_cifar / "cifar10" / "cifar-10-batches-py"
    train, test = load_dataset("cifar10", "train"), load_dataset("cifar10", "test")  # by name, as training reads it
    assert (tuple(train.images.shape), tuple(test.images.shape)) == ((20, 32, 32, 3), (10, 32, 32, 3))
    assert test.labels.tolist() == list(range(10)) and test.classes[3] == "class3"
    assert test.source == "torchvision:cifar10"
    served = len(cifar_server)
    assert main(["data", "cifar10"]) == 0  # already here: nothing fetched again
    assert capsys.readouterr().out == f"cifar10: already here, read from {no_cifar / 'cifar10'}\n"
    assert len(cifar_server) == served


def test_reading_cifar10_by_name_downloads_it_when_missing(no_cifar, cifar_server):
    """``load_dataset('cifar10')`` (a training run's data) fetches what is missing into the data folder, as
    ``vitlab data cifar10`` would."""
    assert len(load_dataset("cifar10", "test")) == 10
    assert (no_cifar / "cifar10" / "cifar-10-python.tar.gz").is_file()


def test_vitlab_data_offline_fails_with_the_fields_and_leaves_no_folder(no_cifar, monkeypatch, capsys):
    """Offline, the download fails: as a refused connection (nothing listens on 127.0.0.1:9)."""
    monkeypatch.setattr(CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    with pytest.raises(DatasetMissing) as err:
        fetch_cifar("cifar10")
    e = err.value
    assert e.dataset == "cifar10" and e.looked_in == (str(no_cifar / "cifar10"), str(vitlab.data.datasets.SHARED_CIFAR10))
    assert e.cause.startswith("URLError") and "`vitlab data cifar10`" in e.fix
    assert not no_cifar.exists()  # the folders made for the download are gone again
    assert main(["data", "cifar10"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("vitlab data: DatasetMissing: cifar10 is not on this machine") and e.fix in said
    with pytest.raises(SystemExit):  # argparse: only the data sets it fetches
        main(["data", "imagenet"])
    assert "invalid choice: 'imagenet'" in capsys.readouterr().err


def test_the_suite_fails_a_test_that_reaches_the_network(tmp_path):
    """conftest's guard in a pytest of its own: a test that swallows the refused connection still fails (at its
    teardown, naming the host); loopback connections pass."""
    (tmp_path / "test_guarded.py").write_text(
        "import socket, urllib.request\n\n"
        "def test_reaches_out():\n"
        "    try:\n"
        "        urllib.request.urlopen('http://example.com/', timeout=2)\n"
        "    except OSError:\n"
        "        pass\n\n"
        "def test_reaches_an_address():\n"
        "    with socket.socket() as s:\n"
        "        assert s.connect_ex(('192.0.2.1', 80)) != 0\n\n"
        "def test_loopback_is_fine():\n"
        "    with socket.socket() as server:\n"
        "        server.bind(('127.0.0.1', 0))\n"
        "        server.listen()\n"
        "        socket.create_connection(server.getsockname(), timeout=5).close()\n"
        "        socket.create_connection(('localhost', server.getsockname()[1]), timeout=5).close()\n\n"
        "def test_mapped_loopback_is_fine():\n"
        "    from conftest import _loopback\n"
        "    assert _loopback('::ffff:127.0.0.1') and _loopback('::1') and _loopback('0.0.0.0')\n"
        "    assert not _loopback('::ffff:192.0.2.1') and not _loopback('example.com')\n")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}  # urllib goes direct
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rA",
                          str(tmp_path / "test_guarded.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    report = out.stdout
    assert out.returncode == 1, report[-3000:]
    assert "PASSED test_guarded.py::test_loopback_is_fine" in report, report[-3000:]
    assert "PASSED test_guarded.py::test_mapped_loopback_is_fine" in report, report[-3000:]
    assert "ERROR test_guarded.py::test_reaches_out" in report and "name lookup of 'example.com'" in report
    assert "ERROR test_guarded.py::test_reaches_an_address" in report and "connect to ('192.0.2.1', 80)" in report
