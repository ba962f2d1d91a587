"""`python -m interlude_localcloud --port P --gcs-port G --scenario FILE --state-dir DIR`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from interlude_localcloud import scenario as scenario_mod
from interlude_localcloud.app import LocalCloud
from interlude_localcloud.forkserver.client import ForkServer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="interlude_localcloud", description=__doc__)
    p.add_argument("--port", type=int, default=8470)
    p.add_argument("--gcs-port", type=int, default=9023)
    p.add_argument("--scenario", default="default", help="YAML path or shipped scenario name")
    p.add_argument("--state-dir", type=Path, default=Path(".localcloud"))
    p.add_argument("--strict", action="store_true", help="validate every answer against discovery docs")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    lc = LocalCloud(
        scenario_mod.load(args.scenario),
        state_dir=args.state_dir,
        port=args.port,
        gcs_port=args.gcs_port,
        strict=args.strict,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    lc.start()
    ForkServer.shared()  # begin importing the workload once for every machine's boot (forkserver/)
    try:
        print(
            json.dumps(
                {
                    "ready": True,
                    "api_endpoint": lc.api_endpoint,
                    "gcs_endpoint": lc.gcs_endpoint,
                    "container_endpoint": lc.container_endpoint,
                    "project": lc.scenario.project,
                    "time_scale": lc.scenario.time_scale,
                }
            ),
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    finally:
        lc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
