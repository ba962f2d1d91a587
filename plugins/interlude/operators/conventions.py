"""Conventions shared by Interlude's operators and sensors, as the Google provider follows them."""

from __future__ import annotations

import os
from configparser import ConfigParser

_ENV = "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"


def default_deferrable() -> bool:
    """`[operators] default_deferrable` when a deployment sets it, True otherwise.

    Airflow's own default for the option is False (and the provider's operators follow it); Interlude's
    waits last hours (maintenance windows, capacity, checkpoints) and would hold a worker slot all that
    time, so deferring is the default unless the deployment sets the option, in airflow.cfg or the
    environment, for every operator at once.
    """
    from airflow.configuration import conf

    explicitly_set = _ENV in os.environ or ConfigParser.has_option(conf, "operators", "default_deferrable")
    return conf.getboolean("operators", "default_deferrable") if explicitly_set else True
