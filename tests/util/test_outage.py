"""Riding out a service's outage (paiexp.util.outage): which errors are an outage, told how.

The errors are real ones: an MLflow client and a database driver against a port nothing
listens on, a real tracking server's and a real PostgreSQL's answers that reject a call.
"""

from __future__ import annotations

import pytest
from servers import MlflowServer, Postgres, free_port

from paiexp.tracking.mlflow_tracker import transient_tracking_error
from paiexp.util.outage import Outage, OutageTooLong, describe, transient_database_error
from paiexp.util.retry import RetryPolicy

QUICK = RetryPolicy(base_delay=0.01, max_delay=0.02)


def error_of(call: object) -> BaseException:
    with pytest.raises(Exception) as raised:
        call()  # type: ignore[operator]
    return raised.value


@pytest.mark.slow
def test_a_tracking_server_that_does_not_answer_is_an_outage_a_rejection_is_not(
    monkeypatch: pytest.MonkeyPatch, tracking_server: MlflowServer
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    nobody = MlflowClient(tracking_uri=f"http://127.0.0.1:{free_port()}")
    refused = error_of(lambda: nobody.get_experiment_by_name("x"))
    assert transient_tracking_error(refused)
    assert describe(refused) == "Connection refused"

    server = MlflowClient(tracking_uri=tracking_server.uri)
    missing = error_of(lambda: server.get_run("0" * 32))
    assert not transient_tracking_error(missing)


def test_a_database_server_gone_is_an_outage_a_bad_statement_is_not(postgres: Postgres) -> None:
    import sqlalchemy as sa

    gone = sa.create_engine(f"postgresql://paiexp@127.0.0.1:{free_port()}/postgres")
    refused = error_of(lambda: gone.connect())
    assert transient_database_error(refused)

    engine = sa.create_engine(postgres.url("postgres"))
    with engine.connect() as connection:
        bad = error_of(lambda: connection.execute(sa.text("SELECT * FROM no_such_table")))
    assert not transient_database_error(bad)
    engine.dispose()


def outage(notices: list[str], limit: float = 5.0) -> Outage:
    return Outage(
        service="test service",
        key="test.outage_timeout",
        limit=limit,
        transient=lambda exc: isinstance(exc, ConnectionError),
        notify=notices.append,
        backoff=QUICK,
    )


def failing(times: int, error: Exception) -> object:
    """A call that raises ``error`` its first ``times`` calls, then returns how often it ran."""
    calls = []

    def call() -> int:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return len(calls)

    return call


def test_an_outage_is_ridden_out_and_told_once_when_it_lasts() -> None:
    notices: list[str] = []
    rider = outage(notices)
    assert rider.call(failing(1, ConnectionRefusedError("[Errno 111] Connection refused"))) == 2
    assert notices == [], "a blip one retry rode out is not worth a word"

    assert rider.call(failing(5, ConnectionRefusedError("[Errno 111] Connection refused"))) == 6
    assert len(notices) == 2, notices
    assert notices[0].startswith("test service is not answering (Connection refused)")
    assert "test.outage_timeout" in notices[0]
    assert notices[1].startswith("test service is back after")


def test_a_rejection_is_raised_at_once_and_a_long_outage_names_its_key() -> None:
    notices: list[str] = []
    rider = outage(notices, limit=0.2)
    call = failing(1, ValueError("bad request"))
    with pytest.raises(ValueError):
        rider.call(call)
    assert call() == 2, "a rejected call was tried again"  # type: ignore[operator]

    with pytest.raises(OutageTooLong, match=r"^test\.outage_timeout: the test service has not"):
        rider.call(failing(10_000, ConnectionResetError("reset")))
    assert rider.down_since is None  # the next outage is counted from its own start


def test_a_study_database_is_tried_again_at_least_every_heartbeat_interval() -> None:
    """Once the database is back, each launcher heartbeats within an interval: long before a
    launcher sharing the study takes it for gone (a grace period of silence)."""
    import sqlalchemy as sa

    from paiexp.sweep.ownership import heartbeat_interval
    from paiexp.sweep.study import storage_outage

    url = f"postgresql://paiexp@127.0.0.1:{free_port()}/study"
    refused = error_of(lambda: sa.create_engine(url).connect())
    grace = 4.0
    waits: dict[float, list[float]] = {}
    for longest in (heartbeat_interval(grace), 10.0):
        rider = storage_outage(url, 300, lambda text: None, longest_wait=longest)
        rider.sleep = waits.setdefault(longest, []).append
        assert rider.call(failing(40, refused)) == 41  # type: ignore[arg-type]
    assert max(waits[heartbeat_interval(grace)]) <= grace / 4
    assert max(waits[10.0]) > grace / 4, "the wait is not capped by the default backoff alone"
