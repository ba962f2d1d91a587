"""Credentials and project from an Airflow ``google_cloud_platform`` connection, without the provider's hook module.

The async hooks run in the triggerer, where every imported module is paid once per trigger-runner process:
``airflow.providers.google.common.hooks.base_google`` brings googleapiclient, httplib2, gcloud-aio/aiohttp and
(through ``credentials_provider``) the Secret Manager client, ~17 MB that watching a machine never uses. The
common connection forms - anonymous, a JSON key file (``key_path``), a JSON key (``keyfile_dict``), or none
(Application Default Credentials) - are loaded here exactly as the provider's ``_CredentialProvider`` loads
them (same fields, same scopes, the ``project`` extra overriding the key's project); every other form
(a key in Secret Manager, a credential configuration file, impersonation, workload identity federation, a
quota project) goes to the provider's own ``GoogleBaseHook``, imported only then. The workers' sync hooks keep
``GoogleBaseHook`` (``interlude.hooks.connection``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
"""The provider's default scopes when the connection names none (``base_google._DEFAULT_SCOPES``)."""

PROVIDER_ONLY_FIELDS = (
    "key_secret_name",
    "credential_config_file",
    "impersonation_chain",
    "idp_issuer_url",
    "client_id",
    "client_secret",
    "quota_project_id",
)
"""Connection extras whose credentials only the provider's hook builds (the lean path hands them over)."""


class Source(StrEnum):
    """Where a connection's credentials come from."""

    ANONYMOUS = "anonymous"
    KEY_PATH = "key_path"
    KEYFILE_DICT = "keyfile_dict"
    DEFAULT = "default"  # Application Default Credentials (google.auth.default)
    PROVIDER = "provider"  # the Google provider's GoogleBaseHook decides


def get_field(extras: Mapping[str, Any], name: str) -> Any:
    """An extra by its short name, else by the legacy ``extra__google_cloud_platform__`` name; "" is None
    (the provider's ``base_google.get_field``)."""
    value = extras[name] if name in extras else extras.get(f"extra__google_cloud_platform__{name}")
    return None if value == "" else value


def credential_source(extras: Mapping[str, Any], impersonation_chain: str | list[str] | None = None) -> Source:
    """Which loader a connection's extras call for. Anything the lean loaders do not mirror exactly, including
    a key file without the ``.json`` name the provider insists on, goes to the provider (and its errors)."""
    if impersonation_chain or any(get_field(extras, name) for name in PROVIDER_ONLY_FIELDS):
        return Source.PROVIDER
    key_path, keyfile = get_field(extras, "key_path"), get_field(extras, "keyfile_dict")
    if key_path and keyfile:
        return Source.PROVIDER  # the provider refuses both at once
    if get_field(extras, "is_anonymous"):
        return Source.ANONYMOUS
    if key_path:
        return Source.KEY_PATH if str(key_path).endswith(".json") else Source.PROVIDER
    if keyfile:
        return Source.KEYFILE_DICT
    return Source.DEFAULT


def scopes(extras: Mapping[str, Any]) -> tuple[str, ...]:
    """The connection's comma-separated ``scope`` extra, else the provider's default."""
    value = get_field(extras, "scope")
    return tuple(s.strip() for s in str(value).split(",")) if value else DEFAULT_SCOPES


@dataclass(frozen=True)
class ConnectionSettings:
    """What a hook needs from its connection: credentials, the project, and the extras (endpoints, time scale)."""

    credentials: Credentials
    project: str | None
    extras: Mapping[str, Any] = field(default_factory=dict)

    def field(self, name: str) -> Any:
        return get_field(self.extras, name)


def _keyfile(extras: Mapping[str, Any]) -> dict[str, Any]:
    raw = get_field(extras, "keyfile_dict")
    info = dict(raw) if isinstance(raw, Mapping) else json.loads(raw)
    info["private_key"] = str(info.get("private_key", "")).replace("\\n", "\n")  # escaped newlines, as the provider
    return info


def _lean(source: Source, extras: Mapping[str, Any]) -> tuple[Credentials, str | None]:
    if source is Source.ANONYMOUS:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials(), None
    if source is Source.DEFAULT:
        import google.auth

        credentials, project = google.auth.default(scopes=list(scopes(extras)))
        return credentials, project or None
    from google.oauth2 import service_account

    if source is Source.KEY_PATH:
        sa = service_account.Credentials.from_service_account_file(
            get_field(extras, "key_path"), scopes=list(scopes(extras))
        )
    else:
        sa = service_account.Credentials.from_service_account_info(_keyfile(extras), scopes=list(scopes(extras)))
    return sa, sa.project_id


def _from_provider(conn_id: str, impersonation_chain: str | list[str] | None) -> tuple[Credentials, str | None]:
    module = importlib.import_module("airflow.providers.google.common.hooks.base_google")
    hook = module.GoogleBaseHook(gcp_conn_id=conn_id, impersonation_chain=impersonation_chain)
    credentials, project = hook.get_credentials_and_project_id()
    return credentials, project or None


def load_connection(conn_id: str | None, impersonation_chain: str | list[str] | None = None) -> ConnectionSettings:
    """The connection's credentials and project (blocking: looks the connection up; call it off the event loop).

    ``conn_id=None`` is anonymous with no Airflow connection at all (tests, the local cloud without a database).
    """
    if conn_id is None:
        from google.auth.credentials import AnonymousCredentials

        return ConnectionSettings(AnonymousCredentials(), None, {"is_anonymous": True})
    from airflow.providers.common.compat.sdk import BaseHook

    extras: Mapping[str, Any] = BaseHook.get_connection(conn_id).extra_dejson
    source = credential_source(extras, impersonation_chain)
    if source is Source.PROVIDER:
        credentials, project = _from_provider(conn_id, impersonation_chain)
    else:
        credentials, project = _lean(source, extras)
    return ConnectionSettings(credentials, get_field(extras, "project") or project, extras)
