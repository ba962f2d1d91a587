"""Deployment glue: what an Airflow deployment points its configuration at (Celery config, worker preload)."""
