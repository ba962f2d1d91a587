"""Interlude's test and development tooling: not shipped with `interlude`, never imported by it.

| module | holds |
|---|---|
| `wiring` | starts the local cloud, makes buckets and Airflow homes: what the demos and tests share |
| `warm_cli` / `warm_server` | a forking Airflow CLI server, so the suite's `airflow` commands skip the import cost |
| `notice_runs` | `by_notice` vs `checkpoint_at_notice` runs (notice_policy benchmark and fault test) |
| `apt` | installs Debian packages once across processes (the test stack's PostgreSQL and Redis) |
"""
