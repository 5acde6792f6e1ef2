"""Shared fixtures: tiny models that build in milliseconds on CPU."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest
import threadpoolctl
import timm
import torch

import vitlab
from vitlab.data.datasets import cifar_places, data_dir, find_cifar

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's waits for a
# descheduled thread make every small op many times slower: tests run on one thread.
torch.set_num_threads(1)
# numpy's BLAS too, even where numpy was loaded before this file: a QR of a 768 x 28 matrix (the filter verdicts' null
# draws) costs some 25 times the CPU time on two threads as on one while another process holds the other core.
threadpoolctl.threadpool_limits(1)
# and in the processes the tests start (CLI runs, sweep workers, Voila kernels, notebooks)
os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


@pytest.hookimpl(optionalhook=True)  # `-p no:xdist` runs the suite in one process without this hook's plugin
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (``make test``, ``.ci/run``): two workers per core, at most 8. Each worker runs one thread, and
    many tests wait on a subprocess, a browser or a server, so a second worker fills the core meanwhile."""
    return min(8, 2 * (os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _user_data_dir():
    try:
        return data_dir()
    except RuntimeError:  # no home folder: no data folder either
        return None


#: the user's data folder (``vitlab.data.datasets.data_dir``), fixed before the tests move the cache root, so that the tests
#: read the CIFAR-10 ``vitlab data cifar10`` fetched (and skip when there is none) but write no cache there
USER_DATA = _user_data_dir()
CIFAR10_TEST = find_cifar("cifar10", "test") if USER_DATA is not None else None
#: why a test marked ``cifar10`` skips here: CIFAR-10 is not on this machine (and how to get it), or None when it is
NO_CIFAR10 = None if CIFAR10_TEST is not None else (
    f"CIFAR-10 is not on this machine (looked in {', '.join(map(str, cifar_places('cifar10')))}): "
    "`vitlab data cifar10` fetches it (online), or set VITLAB_DATA to a folder holding cifar10/train.zip "
    "and cifar10/test.zip" if USER_DATA is not None else "no home folder, so no data folder: set VITLAB_DATA")
#: for the tests that read CIFAR-10 (its test split) by name: the ``cifar10`` marker (``.ci/run`` selects them with
#: ``-m cifar10`` for its pass in the checkout), skipped on a machine without it, saying how to get it
needs_cifar10 = pytest.mark.cifar10


def pytest_collection_modifyitems(config, items):
    if NO_CIFAR10 is not None:
        for item in items:
            if item.get_closest_marker("cifar10") is not None:
                item.add_marker(pytest.mark.skip(reason=NO_CIFAR10))


def isolate(monkeypatch: pytest.MonkeyPatch, base) -> None:
    """What every test runs under, set through ``monkeypatch`` with ``base`` the session's temporary folder:
    decoded-image caches there, never the user's ~/.cache/vitlab; data sets read from the user's data folder (an
    empty one where there is none); the Hugging Face hub at this machine's port 9, where nothing listens
    (``vitlab.models.load.hub_reachable`` finds it unreachable without leaving the machine); and no shipped recipes
    for the report's recipes step (``vitlab.report.steps.RECIPES``), so a report made in a test does not judge every
    shipped seed (a test of the step gives it its own toy recipes). The autouse fixture ``_isolated`` calls it for
    each test; a module-scoped fixture, which that does not reach, calls it itself."""
    import vitlab.report.steps as steps

    monkeypatch.setenv("VITLAB_CACHE", str(base / "vitlab-cache"))
    monkeypatch.setenv("VITLAB_DATA", str(USER_DATA or base / "no-data"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(steps, "RECIPES", base / "no-shipped-recipes")


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    isolate(monkeypatch, tmp_path_factory.getbasetemp())


@pytest.fixture
def no_cifar(tmp_path, monkeypatch):
    """A machine without CIFAR-10, as a user's fresh clone is: an empty data folder (``VITLAB_DATA``, returned; not
    made) and no shared copy beside the checkout."""
    import vitlab.data.datasets

    monkeypatch.setenv("VITLAB_DATA", str(tmp_path / "vitlab-data"))
    monkeypatch.setattr(vitlab.data.datasets, "SHARED_CIFAR10", tmp_path / "no-shared" / "datasets" / "cifar10")
    return tmp_path / "vitlab-data"


class NetworkBlocked(OSError):
    """A test tried to reach another machine (``_no_network``): an OSError, as an offline machine's failure is."""


def _loopback(host) -> bool:
    """Whether ``host`` (an address's host part, or a name) stays on this machine: localhost, a loopback or the
    unspecified address (binding to all interfaces is no connection)."""
    if host in (None, "", b"", "localhost", b"localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.decode() if isinstance(host, bytes) else str(host).split("%")[0])
    except ValueError:  # a host name other than localhost
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
    return ip.is_loopback or ip.is_unspecified


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, chosen by the OS (a test must never assume that a fixed port,
    such as ``vitlab app``'s default 8866, is free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _no_network(request, monkeypatch):
    """No test reaches the network: a connection (or a name lookup) to anything but this machine is refused with
    ``NetworkBlocked``, so the code under test sees an offline machine on every machine, and the test fails
    afterwards naming the address. Child processes are not watched (the hub's address: ``isolate``)."""
    tried = []

    def refuse(what):
        tried.append(what)
        raise NetworkBlocked(f"a test must not reach the network: {what} refused (tests/conftest.py _no_network)")

    def guarded(original):
        def connect(sock, address, *rest):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
                refuse(f"connect to {address!r}")
            return original(sock, address, *rest)
        return connect

    getaddrinfo = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if not _loopback(host):
            refuse(f"name lookup of {host!r}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(socket.socket.connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    yield
    if tried:
        pytest.fail(f"{request.node.nodeid} tried to reach the network: {'; '.join(tried)}", pytrace=False)


def tiny_vit(**overrides) -> torch.nn.Module:
    """A 3-block ViT-Ti/4 at 32 px, randomly initialised, in eval mode."""
    cfg = vitlab.vit_config("Ti/4", img_size=32, depth=3, num_classes=10, **overrides)
    return vitlab.build_model(cfg).eval()


def tiny_timm(name: str, **kwargs) -> torch.nn.Module:
    """A timm architecture at reduced depth, random weights, eval mode."""
    kwargs.setdefault("depth", 2)
    return timm.create_model(name, pretrained=False, **kwargs).eval()


@pytest.fixture
def vit():
    return tiny_vit()


def tiny_hybrid(**vit_overrides) -> torch.nn.Module:
    """R(1)+ViT-Ti: the ImageNet stem and one stage, stride 4, so a 32 px image gives an 8x8 grid of 1x1 patches."""
    vit = vitlab.vit_config("Ti/4", img_size=32, depth=1, num_classes=10, **vit_overrides)
    return vitlab.build_model(vitlab.HybridConfig(vit=vit, layers=(1,), stem="imagenet")).eval()


def tiny_bit() -> torch.nn.Module:
    """A two-stage BiT ResNet-v2 with the 32 px stem, 10 classes, eval mode."""
    return vitlab.build_model(vitlab.BiTConfig(layers=(1, 1), stem="cifar", img_size=32, num_classes=10)).eval()


def ref_sincos(gh: int, gw: int, dim: int) -> torch.Tensor:
    """(gh*gw, dim) 2D sin-cos table written out: [sin(y w), sin(x w), cos(y w), cos(x w)], w = 1/10000^(k/(dim/4))."""
    d = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(d, dtype=torch.float64) / d)
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    y, x = y.reshape(-1, 1) * omega, x.reshape(-1, 1) * omega
    return torch.cat([y.sin(), x.sin(), y.cos(), x.cos()], dim=1).float()


def outputs(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output for ``x`` in eval mode, without autograd."""
    with torch.no_grad():
        return model.eval()(x)


@pytest.fixture
def x32() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32)


@pytest.fixture(scope="session")
def two_class_folder(tmp_path_factory):
    """An ImageFolder of 32 px images, two classes: 16 training and 4 test images each (tiny training runs)."""
    from _reference import make_folder

    root = tmp_path_factory.mktemp("two_class")
    make_folder(root / "train", n_per_class=16, size=32, classes=("a", "b"))
    make_folder(root / "test", n_per_class=4, size=32, classes=("a", "b"))
    return root


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """An ImageFolder of 32 px images, three classes: 48 training and 8 test images each (tiny training runs)."""
    from _reference import make_folder

    root = tmp_path_factory.mktemp("imgs")
    make_folder(root / "train", n_per_class=48, size=32, classes=("a", "b", "c"))
    make_folder(root / "test", n_per_class=8, size=32, classes=("a", "b", "c"))
    return root


def tiny_convit(**kwargs) -> torch.nn.Module:
    """timm's ConViT at 32 px with 4x4 patches (an 8x8 grid), 4 blocks of which the first 2 are gated positional
    self-attention over the patches alone; the class token joins before block 2. Random weights, eval mode."""
    kwargs = {"img_size": 32, "patch_size": 4, "depth": 4, "local_up_to_layer": 2, "num_classes": 10, **kwargs}
    return timm.create_model("convit_tiny", pretrained=False, **kwargs).eval()


def attention_inputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Per block of ``model.blocks``, the tensor its ``attn`` module received in one no-grad forward of ``x``
    (grabbed with a pre-hook of our own, removed after): what an independent recomputation of the attention starts
    from."""
    inputs = []
    handles = [blk.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach())) for blk in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return inputs


def convit_raw_attention(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Per block, the attention timm's ConViT applies, recomputed in float64 from each block's attention input
    (grabbed with a forward hook of our own): GPSA blocks through timm's ``get_attention`` (B, H, N, N), the later
    MHSA blocks as softmax(q k^T * scale) over the class token and the patches (B, H, 1 + N, 1 + N)."""
    out = []
    for blk, h in zip(model.blocks, attention_inputs(model, x)):
        at = blk.attn
        if blk.use_gpsa:
            with torch.no_grad():
                out.append(at.get_attention(h).double())
            continue
        B, N, C = h.shape
        qkv = (h.double() @ at.qkv.weight.double().T).reshape(B, N, 3, at.num_heads, C // at.num_heads)
        q, k, _ = qkv.permute(2, 0, 3, 1, 4)
        out.append(((q @ k.transpose(-2, -1)) * at.scale).softmax(-1))
    return out
