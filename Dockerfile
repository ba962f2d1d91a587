# One image for every Airflow component and the local cloud (docker-compose.yaml).
# Installs exactly what `make` installs: requirements.txt pinned by constraints.txt, then the repo editable.
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 AIRFLOW_HOME=/opt/airflow
WORKDIR /opt/interlude
COPY requirements.txt constraints.txt pyproject.toml ./
RUN pip install -r requirements.txt -c constraints.txt
COPY . .
RUN pip install --no-deps -e . \
    && useradd --create-home --uid 50000 airflow \
    && mkdir -p /opt/airflow /var/lib/interlude && chown -R airflow /opt/airflow /var/lib/interlude
USER airflow
