"""Alerts reach a real webhook on loopback through apprise, once per event, rate-limited, with a
digest when many fire; their URLs are never shown in clear."""

from __future__ import annotations

import pytest

from supervisor.config import AlertsConfig
from supervisor.engine import Alerter, Delivery, Event, mask_url
from supervisor.errors import ConfigError
from tests.fixtures_alerts import Receiver
from tests.waiting import wait_for


async def wait_for_deliveries(alerter: Alerter, count: int) -> list[Delivery]:
    """The first ``count`` results of ``alerter``'s outboxes."""
    got: list[Delivery] = []

    def came() -> bool:
        got.extend(alerter.collect())
        return len(got) >= count

    await wait_for(came, timeout=60, what=f"{count} delivery result(s)")
    return got


def event(kind: str = "run-died", key: str = "k1", severity: str = "critical") -> Event:
    return Event(
        kind=kind,  # type: ignore[arg-type]
        severity=severity,  # type: ignore[arg-type]
        host="gpu-box",
        run="eagle3-kimi",
        title="eagle3-kimi",
        message="Run stopped (pid 4242) on gpu-box",
        command="runwatch launch eagle3-kimi",
        key=key,
        time=1.0,
        lines=["last lines of run.log:", "Traceback: CUDA out of memory"],
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_an_event_is_delivered_to_a_json_webhook_with_the_command(
    receiver: Receiver,
) -> None:
    alerter = Alerter(AlertsConfig(urls=[receiver.url("alerts")]))
    await alerter.submit([event()])
    delivered = await alerter.drain(30)
    assert [(d.ok, d.target) for d in delivered] == [(True, "json://127.0.0.1/***")]
    (message,) = receiver.wait(1)
    assert receiver.paths == ["/alerts"]
    assert receiver.bodies[0]["type"] == "failure"  # critical
    assert "eagle3-kimi" in message and "Act: runwatch launch eagle3-kimi" in message
    assert "CUDA out of memory" in message


async def test_the_same_event_is_sent_once_until_it_clears(receiver: Receiver) -> None:
    alerter = Alerter(AlertsConfig(urls=[receiver.url()]))
    await alerter.submit([event()])
    assert await alerter.submit([event()]) == []
    await alerter.submit([event(key="k2")])
    assert len(receiver.wait(2)) == 2
    alerter.keep_only({"k2"})  # k1 cleared: when it comes back it is news again
    await alerter.submit([event(), event(key="k2")])
    assert len(receiver.wait(3)) == 3


async def test_many_at_once_become_one_digest(receiver: Receiver) -> None:
    alerter = Alerter(AlertsConfig(urls=[receiver.url()], digest_over=3))
    many = [event(key=f"k{i}", kind="stalled", severity="warning") for i in range(5)]
    await alerter.submit(many)
    delivered = await alerter.drain(30)
    assert len(delivered) == 1 and len(delivered[0].events) == 5
    (digest,) = receiver.wait(1)
    assert "5 events" in digest
    assert digest.count("runwatch launch eagle3-kimi") == 5


async def test_the_rate_limit_holds_the_rest_for_a_digest_later(receiver: Receiver) -> None:
    clock = Clock()
    alerter = Alerter(AlertsConfig(urls=[receiver.url()], max_per_minute=2), clock=clock)
    await alerter.submit([event(key="a")])
    await alerter.submit([event(key="b")])
    await alerter.submit([event(key="c")])
    await alerter.submit([event(key="d")])
    assert len(receiver.wait(2)) == 2
    assert [e.key for e in alerter.pending] == ["c", "d"]
    await alerter.drain(30)
    clock.now += 61
    await alerter.flush()
    delivered = await alerter.drain(30)
    assert len(delivered) == 1 and [e.key for e in delivered[0].events] == ["c", "d"]
    assert "2 events" in receiver.wait(3)[2]


async def test_filters_by_kind_and_severity(receiver: Receiver) -> None:
    cfg = AlertsConfig(
        urls=[receiver.url()], events=["run-died", "stalled"], min_severity="warning"
    )
    alerter = Alerter(cfg)
    await alerter.submit(
        [
            event(kind="dataset-done", key="a", severity="info"),
            event(kind="stalled", key="b", severity="warning"),
            event(kind="host-lost", key="c", severity="critical"),
        ]
    )
    messages = receiver.wait(1)
    await alerter.drain(30)
    assert len(messages) == 1 and alerter.deliveries[0].events[0].key == "b"


async def test_an_unreachable_receiver_is_reported_not_raised() -> None:
    from tests.fixtures_sshd import free_port

    alerter = Alerter(AlertsConfig(urls=[f"json://127.0.0.1:{free_port()}/x"]))
    await alerter.submit([event()])
    (delivery,) = await wait_for_deliveries(alerter, 1)
    assert not delivery.ok and delivery.error and not delivery.final
    assert alerter.waiting == 1  # kept, retried with backoff
    alerter.close()


def test_urls_are_masked() -> None:
    assert mask_url("ntfy://user:s3cret@ntfy.sh/topic-xyz?token=abc") == "ntfy://ntfy.sh/***"
    assert mask_url("json://127.0.0.1:8080") == "json://127.0.0.1"
    assert "T000/B000" not in mask_url("slack://T000/B000/XXXX")
    assert mask_url("not a url") == "***"


def test_unknown_event_kinds_and_urls_are_config_errors() -> None:
    from supervisor.alerts import check_alerts

    with pytest.raises(ConfigError, match="unknown event kind"):
        check_alerts(AlertsConfig(events=["run-dead"]))
    with pytest.raises(ConfigError, match="does not understand") as err:
        check_alerts(AlertsConfig(urls=["nosuchscheme://secret-token@example.org/x"]))
    assert "secret-token" not in str(err.value)


async def test_a_long_lived_alerter_keeps_only_the_newest_deliveries(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import supervisor.alerts

    monkeypatch.setattr(supervisor.alerts, "EVENTS_KEPT", 3)
    alerter = Alerter(AlertsConfig(urls=[receiver.url()], max_per_minute=100))
    for k in range(5):
        await alerter.submit([event(key=f"k{k}")])
    assert len(receiver.wait(5)) == 5  # every one was sent
    await alerter.drain(30)
    assert [d.events[0].key for d in alerter.deliveries] == ["k2", "k3", "k4"]
