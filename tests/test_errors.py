"""The error hierarchy by category (issue #23): the categories every backend raises, the
older names still importable as the same classes, a short top-level ``__all__``, and an
``import etcdfence`` that loads neither grpc nor protobuf."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

import etcdfence as ef
import etcdfence.errors as errors

#: Every older name (0.1 and 0.2) and the class it has always meant.
OLD_NAMES = {
    "EtcdUnavailableError": errors.UnavailableError,
    "EtcdRequestError": errors.RequestError,
    "EtcdUnavailable": errors.UnavailableError,
    "OutcomeUnknown": errors.OutcomeUnknownError,
    "LeaseNotFound": errors.LeaseNotFoundError,
    "AuthTokenExpired": errors.AuthTokenExpiredError,
    "SessionExpired": errors.SessionExpiredError,
    "AcquireTimeout": errors.AcquireTimeoutError,
    "AlreadyHeld": errors.AlreadyHeldError,
    "NotLeader": errors.NotLeaderError,
    "InvalidArgument": errors.InvalidArgumentError,
    "InvalidType": errors.InvalidTypeError,
    "InvalidToken": errors.InvalidTokenError,
    "TransactionInProgress": errors.TransactionInProgressError,
    "TransactionAborted": errors.TransactionAbortedError,
}

#: The errors a caller routinely catches: the only ones the top level lists.
ROUTINE = {
    "EtcdfenceError",
    "UnavailableError",
    "RequestError",
    "OutcomeUnknownError",
    "StaleTokenError",
    "NotOwnerError",
    "NotLeaderError",
    "SessionExpiredError",
    "AcquireTimeoutError",
    "InvalidTokenError",
    "ForeignTokenError",
    "FutureTokenError",
    "CompactedError",
}


def _error_classes() -> dict[str, type]:
    return {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.EtcdfenceError)
    }


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_every_older_name_imports_as_the_same_class(name: str) -> None:
    cls = OLD_NAMES[name]
    assert getattr(errors, name) is cls
    assert getattr(ef, name) is cls  # resolved by the top level's __getattr__
    namespace: dict[str, object] = {}
    exec(f"from etcdfence import {name} as top\nfrom etcdfence.errors import {name} as mod",
         namespace)  # fmt: skip
    assert namespace["top"] is cls and namespace["mod"] is cls
    assert name not in ef.__all__ and name not in errors.__all__


def test_every_error_class_is_reachable_from_both_places() -> None:
    classes = _error_classes()
    assert set(errors.__all__) == {n for n, c in classes.items() if c.__name__ == n}
    for name, cls in classes.items():
        assert getattr(ef, name) is cls, name


def test_the_top_level_lists_only_the_routinely_caught_errors() -> None:
    classes = _error_classes()
    listed = {n for n in ef.__all__ if n in classes}
    assert listed == ROUTINE
    assert [n for n in ef.__all__ if isinstance(getattr(ef, n), type)
            and issubclass(getattr(ef, n), BaseException)] == sorted(ROUTINE)  # fmt: skip


def test_the_categories_and_what_the_older_handlers_still_catch() -> None:
    assert issubclass(errors.OutcomeUnknownError, errors.UnavailableError)
    assert issubclass(errors.TLSError, errors.UnavailableError)
    assert issubclass(errors.TLSError, errors.AuthError)
    assert issubclass(errors.LeaseNotFoundError, errors.RequestError)
    assert not issubclass(errors.RequestError, errors.UnavailableError)
    lost = errors.OutcomeUnknownError("lost", resource="r", token=3, epoch=1, fenced_off=False)
    # 0.2 code wrote `except EtcdUnavailableError` around any fence's write:
    with pytest.raises(ef.EtcdUnavailableError):
        raise lost
    copy = pickle.loads(pickle.dumps(lost))
    assert type(copy) is errors.OutcomeUnknownError and copy.epoch == 1
    foreign = errors.ForeignTokenError("f", token=7, lock="a", cluster_id=9)
    back = pickle.loads(pickle.dumps(foreign))
    assert (str(back), back.token, back.lock, back.cluster_id) == ("f", 7, "a", 9)
    future = pickle.loads(pickle.dumps(errors.FutureTokenError("x", token=9, revision=3)))
    assert (str(future), future.token, future.revision) == ("x", 9, 3)
    assert issubclass(errors.FutureTokenError, errors.InvalidTokenError)
    # The Redis backend's own classes are the categories' subclasses.
    redis_mod = importlib.import_module("etcdfence.redis")
    assert issubclass(redis_mod.RedisUnavailableError, errors.UnavailableError)
    assert issubclass(redis_mod.RedisRequestError, errors.RequestError)


def test_etcd_raises_the_categories_and_old_handlers_catch_them(
    etcd_client: ef.Client, etcd_namespace: str
) -> None:
    with (
        ef.Client("127.0.0.1:1", timeout=0.5) as dead,
        pytest.raises(ef.UnavailableError) as unavailable,
    ):
        dead.get("k")
    try:
        raise unavailable.value
    except ef.EtcdUnavailableError:  # what 0.2 code wrote
        pass
    with pytest.raises(ef.RequestError) as refused:
        etcd_client.put(f"{etcd_namespace}/big", b"x" * (3 * 1024 * 1024))
    assert isinstance(refused.value, ef.EtcdRequestError)
    assert type(unavailable.value).__name__ == "UnavailableError"


def test_importing_the_shared_modules_loads_no_grpc_or_protobuf() -> None:
    code = (
        "import sys\n"
        "import etcdfence, etcdfence.fence, etcdfence.errors, etcdfence.token\n"
        "import etcdfence.metrics, etcdfence._log, etcdfence._keys, etcdfence.types\n"
        "import etcdfence.epochs, etcdfence.fence.epochs, etcdfence.http\n"
        "import etcdfence.fence.http\n"
        "assert 'EtcdUnavailable' not in dir(etcdfence)\n"
        "assert etcdfence.EtcdUnavailable is etcdfence.UnavailableError\n"
        "assert etcdfence.TLSError.__module__ == 'etcdfence.errors'\n"
        "loaded = {m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', "
        "'google.protobuf'))}\n"
        "assert not loaded, sorted(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
