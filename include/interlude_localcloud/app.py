"""Assemble the local cloud: state + API modules + HTTP server + GCS emulator, started and stopped as one."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from interlude_localcloud.admin_api import AdminApi
from interlude_localcloud.cloud import Cloud
from interlude_localcloud.gcs import GcsEmulator
from interlude_localcloud.gke.admin_api import GkeAdminApi
from interlude_localcloud.gke.clusters import Gke
from interlude_localcloud.gke.container_api import ContainerApi
from interlude_localcloud.metadata_api import MetadataApi
from interlude_localcloud.pages import Pages
from interlude_localcloud.scenario import Scenario
from interlude_localcloud.server import LocalCloudServer, Router, serve
from interlude_localcloud.tpu_api import TpuApi


class LocalCloud:
    """One running local cloud. `start()` returns once both servers accept connections."""

    def __init__(
        self,
        scenario: Scenario,
        state_dir: Path | None = None,
        port: int = 0,
        gcs_port: int = 0,
        strict: bool = False,
        gcs: bool = True,
    ) -> None:
        self.scenario = scenario
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="localcloud-")
            state_dir = Path(self._tmp.name)
        self.state_dir = Path(state_dir)
        self.port = port
        self.strict = strict
        self.gcs = GcsEmulator(gcs_port, self.state_dir / "gcs") if gcs else None
        self.cloud = Cloud(scenario, self.state_dir)
        self.gke = Gke(self.cloud, scenario.gke_clusters, self.state_dir)
        self.server: LocalCloudServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def api_endpoint(self) -> str:
        return self.cloud.api_endpoint

    @property
    def container_endpoint(self) -> str:
        """GKE's Container API is served by the same server as TPU and Compute (paths under /v1/)."""
        return self.cloud.api_endpoint

    @property
    def gcs_endpoint(self) -> str:
        return self.cloud.gcs_endpoint

    @property
    def project(self) -> str:
        return self.scenario.project

    def start(self) -> LocalCloud:
        from interlude_localcloud.compute_api import ComputeApi

        router = Router()
        TpuApi(self.cloud).register(router)
        ComputeApi(self.cloud).register(router)
        ContainerApi(self.cloud, self.gke).register(router)
        MetadataApi(self.cloud).register(router)
        AdminApi(self.cloud).register(router)
        GkeAdminApi(self.gke).register(router)
        Pages(self.cloud).register(router)
        if self.gcs is not None:
            self.gcs.start()
            self.cloud.gcs_endpoint = self.gcs.endpoint
        try:
            self.gke.start()
            self.server, self._thread = serve(self.port, self.cloud, router, self.strict)
        except Exception:
            self.gke.stop()
            if self.gcs is not None:
                self.gcs.stop()
            raise
        self.port = self.server.server_address[1]
        self.cloud.api_endpoint = f"http://127.0.0.1:{self.port}"
        self.cloud.start()
        return self

    def stop(self) -> None:
        """Stop serving, kill every machine process group, stop GCS, drop a temporary state dir."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.gke.stop()
        self.cloud.stop()
        if self.gcs is not None:
            self.gcs.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
