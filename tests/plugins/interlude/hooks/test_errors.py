"""The error shapes Google answers with (hookapi.md) map to the exception classes callers decide on."""

from __future__ import annotations

import pickle

import pytest

from interlude.hooks.errors import (
    AlreadyExistsError,
    CloudError,
    InvalidRequestError,
    NotFoundError,
    QuotaExceededError,
    StockoutError,
    TransientError,
    error_from_compute_operation,
    error_from_http,
    error_from_rpc_status,
)

TPU_STOCKOUT = (
    'There is no more capacity in the zone "us-east5-b"; you can try in another zone where Cloud TPU '
    "Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1234]"
)
TPU_QUOTA = "Quota limit 'TPUV6EPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 8 in zone us-east5-b."
GCE_POOL = (
    "The zone 'projects/p/zones/us-central1-a' does not have enough resources available to fulfill the "
    "request. Try a different zone, or try again later."
)


def test_tpu_operation_stockout_and_quota_are_told_apart_by_message() -> None:
    stockout = error_from_rpc_status({"code": 8, "message": TPU_STOCKOUT})
    quota = error_from_rpc_status({"code": 8, "message": TPU_QUOTA})
    assert type(stockout) is StockoutError and stockout.message == TPU_STOCKOUT
    assert stockout.status == "RESOURCE_EXHAUSTED" and stockout.code == 429
    assert type(quota) is QuotaExceededError and quota.message == TPU_QUOTA


@pytest.mark.parametrize(
    ("code", "cls"),
    [(5, NotFoundError), (6, AlreadyExistsError), (3, InvalidRequestError), (14, TransientError), (13, CloudError)],
)
def test_tpu_operation_other_codes(code: int, cls: type[CloudError]) -> None:
    assert type(error_from_rpc_status({"code": code, "message": "m"})) is cls


def test_compute_operation_pool_exhausted_is_stockout() -> None:
    op = {
        "status": "DONE",
        "httpErrorStatusCode": 503,
        "error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": GCE_POOL}]},
    }
    err = error_from_compute_operation(op)
    assert type(err) is StockoutError
    assert err.status == "ZONE_RESOURCE_POOL_EXHAUSTED" and err.message == GCE_POOL


def test_compute_operation_quota_code() -> None:
    op = {"error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'CPUS' exceeded."}]}}
    assert type(error_from_compute_operation(op)) is QuotaExceededError


def test_compute_insert_quota_403() -> None:
    body = {
        "error": {
            "code": 403,
            "message": "Quota 'NVIDIA_L4_GPUS' exceeded. Limit: 8.0 in region us-central1.",
            "errors": [{"domain": "usageLimits", "reason": "quotaExceeded", "message": "..."}],
        }
    }
    err = error_from_http(403, body)
    assert type(err) is QuotaExceededError
    assert err.message.startswith("Quota 'NVIDIA_L4_GPUS' exceeded") and err.code == 403


def test_plain_403_is_not_quota() -> None:
    err = error_from_http(403, {"error": {"code": 403, "message": "Permission denied", "status": "PERMISSION_DENIED"}})
    assert type(err) is CloudError


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (404, NotFoundError),
        (409, AlreadyExistsError),
        (400, InvalidRequestError),
        (503, TransientError),
        (429, TransientError),
        (500, CloudError),
    ],
)
def test_http_status_classes(status: int, cls: type[CloudError]) -> None:
    err = error_from_http(status, {"error": {"code": status, "message": "said Google", "status": "X"}})
    assert type(err) is cls and err.message == "said Google" and err.code == status


def test_rate_limit_429_stays_transient_even_when_it_mentions_quota() -> None:
    msg = "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'"
    assert type(error_from_http(429, {"error": {"code": 429, "message": msg}})) is TransientError


def test_non_json_error_body_keeps_text() -> None:
    err = error_from_http(502, "<html>Bad Gateway</html>")
    assert type(err) is TransientError and "Bad Gateway" in err.message


def test_errors_survive_pickling_and_print_googles_message() -> None:
    err = StockoutError(TPU_STOCKOUT, 429, "RESOURCE_EXHAUSTED", {"code": 8})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is StockoutError and back.details == {"code": 8} and back.status == "RESOURCE_EXHAUSTED"
    assert TPU_STOCKOUT in str(back)
