"""Who gets which answer from each Interlude page, through Airflow's own api-server app (run as a script by
test_app.py, in a process of its own: Airflow reads its settings once, at import).

The app is `airflow.api_fastapi.app.create_app`, which mounts the plugin from the plugins folder as the api-server
does; the auth manager is Airflow's SimpleAuthManager with the stack's users (include/scripts/stack.py): `viewer`
(the least role that may read DAGs) and `outsider` (no role: may log in, may read nothing). Each logs in through the
auth manager's own `/auth/token`, with the password it generated. The metadata DB is a migrated SQLite home of its
own (a copy of the suite's template), with the stand-ins of Interlude's DAGs and one run of each that
benchmarks/ui_runs.py seeds (run 0: a finished serving run whose timeline is drawn from its XComs alone).

    python route_access.py HOME PATH [PATH ...]   ->   RESULT {"PATH": {"none": 401, "outsider": 403, "viewer": 200}}
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

USERS = {"viewer": "viewer", "outsider": ""}  # name -> SimpleAuthManager role ("": none)


def main(argv: list[str]) -> int:
    home, paths = Path(argv[0]), argv[1:]
    from benchmarks import ui_runs

    ui_runs.environment(home)
    os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = ",".join(f"{u}:{r}" for u, r in USERS.items())
    from interlude_dev import wiring as dev

    dev.ensure_airflow_db(dict(os.environ), log=home / "migrate.log")
    ui_runs.seed(home, 2)

    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    out: dict[str, dict[str, int]] = {}
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        passwords = json.loads((home / "passwords.json").read_text())
        headers: dict[str, dict[str, str]] = {"none": {}}
        for user in USERS:
            login = client.post("/auth/token", json={"username": user, "password": passwords[user]})
            assert login.status_code in (200, 201), (user, login.status_code, login.text[:300])
            headers[user] = {"Authorization": f"Bearer {login.json()['access_token']}"}
        for path in paths:
            out[path] = {
                who: client.get(path, headers=h, follow_redirects=False).status_code for who, h in headers.items()
            }
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
