"""The explorer server's kernel manager: at most ``max_kernels`` kernels live at once (each holds a model, hundreds
of MB), abandoned ones make room for a new page, and a page over the cap is refused with HTTP 503 instead of a new
kernel. Voila builds it from ``VoilaConfiguration.multi_kernel_manager_class`` (see ``vitlab.app.launch``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from jupyter_server.utils import ApiPath
from tornado import web
from traitlets import Float, Integer


class CappedKernelManager(AsyncMappingKernelManager):
    """``AsyncMappingKernelManager`` with a cap on live kernels.

    Starting a kernel when ``max_kernels`` are alive first shuts down, oldest activity first, those that are
    abandoned: not busy, no page connected to them, and no activity for ``reclaim_after`` seconds (a page whose browser
    never connected, or one a crawler loaded). If none is, ``start_kernel`` raises ``tornado.web.HTTPError`` 503
    and no kernel starts. Starts are serialised, so concurrent page loads cannot pass the cap together. Idle kernels
    are also culled on jupyter_server's own timer (``cull_idle_timeout``, ``cull_interval``, ``cull_connected``)."""

    max_kernels = Integer(3, config=True, help="most kernels (explorer pages) alive at once; at least 1")
    reclaim_after = Float(60.0, config=True, help="seconds without activity after which an idle kernel no page is "
                          "connected to is shut down to make room for a new page")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.max_kernels < 1:
            raise ValueError(f"CappedKernelManager.max_kernels must be at least 1, got {self.max_kernels}")
        self._start_lock: asyncio.Lock | None = None

    def live_kernels(self) -> int:
        """Kernels started and not yet shut down, those still starting included."""
        return len(set(self.list_kernel_ids()) | set(self._pending_kernels))

    def abandoned(self) -> list[str]:
        """Ids of the kernels ``start_kernel`` may shut down to make room, the longest inactive first."""
        from jupyter_server._tz import utcnow

        now, found = utcnow(), []
        for kernel_id in self.list_kernel_ids():
            kernel = self.get_kernel(kernel_id)
            last = getattr(kernel, "last_activity", None)
            if (last is None or getattr(kernel, "execution_state", None) == "busy"  # as jupyter_server's culler
                    or self._kernel_connections.get(kernel_id, 0)):
                continue
            if now - last >= timedelta(seconds=self.reclaim_after):
                found.append((last, kernel_id))
        return [kernel_id for _, kernel_id in sorted(found)]

    async def start_kernel(self, *, kernel_id: str | None = None, path: ApiPath | None = None, **kwargs) -> str:
        """Start a kernel as ``AsyncMappingKernelManager`` does, within the cap; raises ``tornado.web.HTTPError``
        (503) when ``max_kernels`` are alive and none is abandoned."""
        if kernel_id is not None and kernel_id in self:
            return await super().start_kernel(kernel_id=kernel_id, path=path, **kwargs)
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            for old in self.abandoned():
                if self.live_kernels() < self.max_kernels:
                    break
                self.log.warning("Shutting down abandoned kernel %s to make room for a new page (at most %d)", old,
                                 self.max_kernels)
                await self.shutdown_kernel(old, now=True)
            if self.live_kernels() >= self.max_kernels:
                raise web.HTTPError(503, "%d explorer pages are open, the most this server keeps (vitlab app "
                                    "--max-pages); close one, or wait until one has been idle for %d s",
                                    self.max_kernels, int(self.reclaim_after),
                                    reason=f"{self.max_kernels} explorer pages are open, the most this server keeps: "
                                    "close one or raise vitlab app --max-pages")
            return await super().start_kernel(kernel_id=kernel_id, path=path, **kwargs)
