"""``python -m vitlab.app.launch NOTEBOOK [VOILA ARGS]``: Voila as ``vitlab app`` runs it.

Started by ``vitlab.app.serve`` only. It reads (and removes, so that no kernel inherits them) the environment
variables ``serve`` sets: ``VITLAB_APP_TOKEN`` (required: every page, kernel and API request needs it, as a
``?token=`` query or the cookie that query sets), ``VITLAB_APP_HOSTS`` (extra Host header names to serve, comma
separated; loopback addresses and ``localhost`` always), ``VITLAB_APP_MAX_PAGES`` (the cap on live kernels) and
``VITLAB_APP_PARENT_PID`` (on Linux this process gets SIGTERM when that process dies, even by SIGKILL, and exits at
once if it is already gone; its kernels exit by themselves once it is gone)."""

from __future__ import annotations

import html
import os
import sys
import tempfile
import threading

from vitlab.base.processes import die_with_parent

#: kernels idle this long with no page connected are shut down by jupyter_server's culler (seconds)
CULL_IDLE_TIMEOUT = 600
#: how often the culler looks (seconds)
CULL_INTERVAL = 60


def server_config(token: str, hosts: tuple[str, ...], max_pages: int):
    """The traitlets ``Config`` that makes Voila refuse requests without ``token`` and with a Host header other than
    a loopback address, ``localhost`` or one of ``hosts`` (HTTP 403: DNS rebinding), and keep at most ``max_pages``
    kernels (``vitlab.app.kernels.CappedKernelManager``), culling idle unconnected ones."""
    from traitlets.config import Config

    if not token:
        raise ValueError("vitlab app needs a token: an empty one would serve anyone who can reach the port")
    c = Config()
    c.Voila.token = token
    # Voila's own settings set allow_remote_access=True; these replace them after (jupyter_server's check_host)
    c.Voila.tornado_settings = {"allow_remote_access": False, "local_hostnames": ["localhost", *hosts]}
    c.VoilaConfiguration.multi_kernel_manager_class = "vitlab.app.kernels.CappedKernelManager"
    c.CappedKernelManager.max_kernels = max_pages
    c.CappedKernelManager.cull_idle_timeout = CULL_IDLE_TIMEOUT
    c.CappedKernelManager.cull_interval = CULL_INTERVAL
    c.CappedKernelManager.cull_connected = False  # an open page keeps its kernel
    return c


def _voila_class():
    from voila.app import Voila

    class VitlabVoila(Voila):
        def launch_browser(self):
            """Open the page with its token, through a temporary file (Jupyter's way: the token stays out of the
            browser's command line, which other users can read)."""
            import webbrowser
            from pathlib import Path

            url = f"{self.connection_url}?token={self.identity_provider.token}"
            fd, name = tempfile.mkstemp(suffix=".html")
            with open(fd, "w", encoding="utf-8") as fh:
                fh.write(f'<meta http-equiv="refresh" content="0;url={html.escape(url)}">')
            threading.Thread(target=webbrowser.open, args=(Path(name).as_uri(),), daemon=True).start()

    return VitlabVoila


def main(argv: list[str] | None = None) -> None:
    env = os.environ
    parent = env.pop("VITLAB_APP_PARENT_PID", None)
    if parent:
        die_with_parent(int(parent))
    token = env.pop("VITLAB_APP_TOKEN", "")
    hosts = tuple(h for h in env.pop("VITLAB_APP_HOSTS", "").split(",") if h)
    max_pages = int(env.pop("VITLAB_APP_MAX_PAGES", "3"))
    _voila_class().launch_instance(argv=sys.argv[1:] if argv is None else argv,
                                   config=server_config(token, hosts, max_pages))


if __name__ == "__main__":
    main()
