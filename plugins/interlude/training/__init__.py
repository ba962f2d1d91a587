"""The training DAG's task bodies, the run spec they read, and the run report they write.

See README.md here; `dags/accelerator_training.py` only wires these.
"""
