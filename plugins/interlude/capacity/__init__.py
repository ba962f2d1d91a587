"""Where a run goes: what Google offers per zone, the TPU-first / GPU-first trees, and where a lost stage moves.

Pure functions over data tables (see README.md here); the Airflow tasks in :mod:`interlude.training.tasks` call them.
"""
