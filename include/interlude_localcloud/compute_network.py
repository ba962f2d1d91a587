"""An instance's network interfaces as Compute Engine shows them: an internal `networkIP` per interface and,
for each "External NAT" access config (type ONE_TO_ONE_NAT) the insert body asked for, an external `natIP`.

Clients read these fields: the Google provider's ComputeEngineHook.get_instance_address returns
`networkInterfaces[0].accessConfigs[0].natIP` (or `networkIP` with use_internal_ip) and fails when the first
interface has no access config. Addresses are unique among the cloud's instances: internal ones from
10.128.0.0/20 (the default network's us-central1 range), external ones from the documentation ranges
203.0.113.0/24 and 198.51.100.0/24 (RFC 5737), never routable, so no local address looks like a real host.
An interface without access configs has no external IP, as on Google
(https://cloud.google.com/compute/docs/reference/rest/v1/instances, networkInterfaces[].accessConfigs[]).
An ephemeral natIP (one the body did not give) is released when the instance stops and a new one is assigned when
it starts again (https://cloud.google.com/compute/docs/ip-addresses#ephemeraladdress); a given (static) one stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

EXTERNAL_RANGES = ("203.0.113", "198.51.100")


def _internal() -> Iterator[str]:
    for third in range(16):
        for fourth in range(2 if third == 0 else 0, 256):
            yield f"10.128.{third}.{fourth}"


def _external() -> Iterator[str]:
    for prefix in EXTERNAL_RANGES:
        for fourth in range(1, 255):
            yield f"{prefix}.{fourth}"


def addresses_in_use(resources: Iterable[dict[str, Any]]) -> set[str]:
    """Every networkIP and natIP the given instance resources hold."""
    used: set[str] = set()
    for res in resources:
        for nic in res.get("networkInterfaces") or []:
            used.add(str(nic.get("networkIP", "")))
            used.update(str(ac.get("natIP", "")) for ac in nic.get("accessConfigs") or [])
    return used


def _free(pool: Iterator[str], used: set[str]) -> str:
    for ip in pool:
        if ip not in used:
            used.add(ip)
            return ip
    raise RuntimeError("the local cloud ran out of addresses")  # 4094 internal / 508 external instances


def _url(base: str, value: str | None, default: str) -> str:
    """A network/subnetwork reference as a full URL (clients send short forms like global/networks/default)."""
    value = value or default
    if value.startswith("http"):
        return value
    if value.startswith("projects/"):
        return base.split("/projects/", 1)[0] + "/" + value
    return f"{base}/{value}"


def _access_config(ac: dict[str, Any], used: set[str]) -> dict[str, Any]:
    out = {k: v for k, v in ac.items() if k != "kind"}
    out["kind"] = "compute#accessConfig"
    out.setdefault("type", "ONE_TO_ONE_NAT")
    if out["type"] == "ONE_TO_ONE_NAT":
        out.setdefault("name", "External NAT")
        out.setdefault("networkTier", "PREMIUM")
        if not out.get("natIP"):  # ephemeral: Google picks one; a static address given in the body is kept
            out["natIP"] = _free(_external(), used)
    return out


def network_interfaces(
    body_nics: list[dict[str, Any]] | None, base: str, region: str, used: set[str]
) -> list[dict[str, Any]]:
    """The `networkInterfaces` of a new instance from its insert body (one default interface when it has none)."""
    out = []
    for i, nic in enumerate(body_nics or [{}]):
        res = {k: v for k, v in nic.items() if k not in ("kind", "name", "fingerprint", "accessConfigs")}
        res.update(
            kind="compute#networkInterface",
            name=f"nic{i}",
            network=_url(base, nic.get("network"), "global/networks/default"),
            subnetwork=_url(base, nic.get("subnetwork"), f"regions/{region}/subnetworks/default"),
            networkIP=nic.get("networkIP") or _free(_internal(), used),
            stackType=nic.get("stackType") or "IPV4_ONLY",
            fingerprint="bG9jYWxuaWM=",
        )
        if nic.get("accessConfigs"):
            res["accessConfigs"] = [_access_config(ac, used) for ac in nic["accessConfigs"]]
        out.append(res)
    return out


def ephemeral_nats(body_nics: list[dict[str, Any]] | None) -> list[tuple[int, int]]:
    """(interface, access config) indexes of the ONE_TO_ONE_NAT configs whose natIP Google picks (ephemeral)."""
    return [
        (i, j)
        for i, nic in enumerate(body_nics or [])
        for j, ac in enumerate(nic.get("accessConfigs") or [])
        if ac.get("type", "ONE_TO_ONE_NAT") == "ONE_TO_ONE_NAT" and not ac.get("natIP")
    ]


def release_ephemeral(resource: dict[str, Any], nats: list[tuple[int, int]]) -> None:
    for i, j in nats:
        resource["networkInterfaces"][i]["accessConfigs"][j].pop("natIP", None)


def assign_ephemeral(resource: dict[str, Any], nats: list[tuple[int, int]], used: set[str]) -> None:
    for i, j in nats:
        config = resource["networkInterfaces"][i]["accessConfigs"][j]
        if not config.get("natIP"):
            config["natIP"] = _free(_external(), used)
