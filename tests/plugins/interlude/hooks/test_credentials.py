"""The triggerer's lean credential loading gives what the Google provider's GoogleBaseHook gives, for every form
it handles itself, and hands every other form to the provider; the async hooks never import the provider's hook.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from interlude.hooks.credentials import DEFAULT_SCOPES, Source, credential_source, get_field, load_connection, scopes

from .conftest import TPU_ZONE

SA_PROJECT = "key-project"


@pytest.fixture(scope="module")
def service_account_key() -> dict[str, str]:
    """A service-account key as Google issues it (JSON), with a freshly generated RSA key: nothing is signed
    or sent, the credentials are only built."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": SA_PROJECT,
        "private_key_id": "0123",
        "private_key": pem,
        "client_email": f"watcher@{SA_PROJECT}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }


@pytest.mark.parametrize(
    ("extras", "chain", "source"),
    [
        ({}, None, Source.DEFAULT),
        ({"project": "p"}, None, Source.DEFAULT),
        ({"is_anonymous": True}, None, Source.ANONYMOUS),
        ({"extra__google_cloud_platform__is_anonymous": True}, None, Source.ANONYMOUS),
        ({"is_anonymous": ""}, None, Source.DEFAULT),  # "" is unset, as the provider reads it
        ({"key_path": "/k.json"}, None, Source.KEY_PATH),
        ({"key_path": "/k.p12"}, None, Source.PROVIDER),  # the provider's own error
        ({"key_path": "/k"}, None, Source.PROVIDER),
        ({"keyfile_dict": "{}"}, None, Source.KEYFILE_DICT),
        ({"key_path": "/k.json", "keyfile_dict": "{}"}, None, Source.PROVIDER),
        ({"is_anonymous": True, "key_path": "/k.json"}, None, Source.ANONYMOUS),
        ({"key_secret_name": "s"}, None, Source.PROVIDER),
        ({"credential_config_file": "/c.json"}, None, Source.PROVIDER),
        ({"impersonation_chain": "a@b"}, None, Source.PROVIDER),
        ({"key_path": "/k.json"}, "a@b", Source.PROVIDER),
        ({}, ["a@b"], Source.PROVIDER),
        ({"idp_issuer_url": "https://idp"}, None, Source.PROVIDER),
        ({"client_id": "c", "client_secret": "s"}, None, Source.PROVIDER),
        ({"quota_project_id": "q"}, None, Source.PROVIDER),
        ({"is_anonymous": True, "quota_project_id": "q"}, None, Source.PROVIDER),
    ],
)
def test_credential_source(extras: dict[str, Any], chain: Any, source: Source) -> None:
    assert credential_source(extras, chain) is source


def test_fields_and_scopes_read_like_the_provider() -> None:
    assert get_field({"project": "a", "extra__google_cloud_platform__project": "b"}, "project") == "a"
    assert get_field({"extra__google_cloud_platform__project": "b"}, "project") == "b"
    assert get_field({"project": ""}, "project") is None
    assert scopes({}) == DEFAULT_SCOPES
    assert scopes({"scope": "https://a, https://b"}) == ("https://a", "https://b")


def _provider(conn_id: str) -> tuple[Any, Any]:
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    return GoogleBaseHook(gcp_conn_id=conn_id).get_credentials_and_project_id()


def _same(conn_id: str) -> None:
    lean = load_connection(conn_id)
    credentials, project = _provider(conn_id)
    assert type(lean.credentials) is type(credentials)
    assert lean.project == (project or None)
    for attr in ("service_account_email", "scopes", "quota_project_id"):
        assert getattr(lean.credentials, attr, None) == getattr(credentials, attr, None), attr


@pytest.mark.parametrize("form", ["anonymous", "key_path", "keyfile_dict", "keyfile_dict_escaped", "adc"])
@pytest.mark.parametrize("project", [None, "conn-project"])
def test_lean_credentials_equal_the_providers(
    form: str, project: str | None, service_account_key: dict[str, str], tmp_path: Path, monkeypatch: Any
) -> None:
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(service_account_key))
    extras: dict[str, Any] = {"scope": "https://www.googleapis.com/auth/cloud-platform.read-only"}
    if form == "anonymous":
        extras["is_anonymous"] = True
    elif form == "key_path":
        extras["key_path"] = str(key_file)
    elif form == "keyfile_dict":
        extras["keyfile_dict"] = json.dumps(service_account_key)
    elif form == "keyfile_dict_escaped":  # newlines pasted as "\n" into the connection form
        escaped = {**service_account_key, "private_key": service_account_key["private_key"].replace("\n", "\\n")}
        extras["keyfile_dict"] = escaped
    else:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    if project:
        extras["project"] = project
    conn = {"conn_type": "google_cloud_platform", "extra": extras}
    monkeypatch.setenv("AIRFLOW_CONN_INTERLUDE_CRED_TEST", json.dumps(conn))
    _same("interlude_cred_test")
    expected = project or (None if form == "anonymous" else SA_PROJECT)
    assert load_connection("interlude_cred_test").project == expected


def test_other_forms_are_the_providers(tmp_path: Path, monkeypatch: Any, service_account_key: dict[str, str]) -> None:
    """A quota project: the provider's own credentials (with its quota project), not a lean copy."""
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(service_account_key))
    extras = {"key_path": str(key_file), "quota_project_id": "billing-project"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_INTERLUDE_CRED_TEST", json.dumps({"conn_type": "google_cloud_platform", "extra": extras})
    )
    _same("interlude_cred_test")
    assert load_connection("interlude_cred_test").credentials.quota_project_id == "billing-project"


WATCH = """
import asyncio, json, sys
from interlude.hooks.tpu_async import AsyncTpuHook
import interlude.triggers.stage

async def main():
    async with AsyncTpuHook("interlude_cred_test") as hook:
        return await hook.list_nodes(sys.argv[1])

nodes = asyncio.run(main())
print(json.dumps({"nodes": len(nodes), "modules": sorted(sys.modules)}))
"""


def test_the_async_hook_reads_the_cloud_without_the_providers_hook_module(localcloud: Any) -> None:
    """In a fresh process (as the trigger runner): the TPU API answers through the connection, and neither the
    provider's base_google (googleapiclient, httplib2, gcloud-aio, aiohttp) nor google-cloud-tpu was imported."""
    extra = {"is_anonymous": True, "project": localcloud.project, "tpu_endpoint": localcloud.api_endpoint}
    env = {
        **os.environ,
        "AIRFLOW_CONN_INTERLUDE_CRED_TEST": json.dumps({"conn_type": "google_cloud_platform", "extra": extra}),
    }
    out = subprocess.run(
        [sys.executable, "-c", WATCH, TPU_ZONE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["nodes"] >= 0
    modules = set(result["modules"])
    for heavy in (
        "airflow.providers.google.common.hooks.base_google",
        "airflow.providers.google.cloud.utils.credentials_provider",
        "googleapiclient",
        "httplib2",
        "gcloud.aio.auth",
        "aiohttp",
        "google.cloud.tpu_v2",
        "google.cloud.compute_v1",
    ):
        assert heavy not in modules, heavy


def test_a_thousand_callers_share_one_connection_lookup(localcloud: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand triggers starting together share one hook: they all get the one lookup's settings (each
    lookup is a round trip to the triggerer's supervisor), and its credentials serve the calls."""
    from interlude.hooks import async_base
    from interlude.hooks.tpu_async import AsyncTpuHook

    lookups: list[str | None] = []

    def counted(conn_id: str | None, chain: Any = None) -> Any:  # the real lookup, counted
        lookups.append(conn_id)
        return load_connection(conn_id, chain)

    monkeypatch.setattr(async_base, "load_connection", counted)
    extra = {"is_anonymous": True, "project": localcloud.project, "tpu_endpoint": localcloud.api_endpoint}
    monkeypatch.setenv(
        "AIRFLOW_CONN_INTERLUDE_CRED_TEST", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )

    async def main() -> tuple[int, int]:
        async with AsyncTpuHook("interlude_cred_test") as hook:
            settings = await asyncio.gather(*(hook.settings() for _ in range(1000)))
            await hook.list_nodes(TPU_ZONE)
            return len({id(s) for s in settings}), len({id(s.credentials) for s in settings})

    assert asyncio.run(main()) == (1, 1)
    assert lookups == ["interlude_cred_test"]
