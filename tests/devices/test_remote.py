"""The ``remote`` backend on a local Dask cluster (two worker processes).

One cluster serves the whole module. The tests check the DeviceAPI contract
on remote devices — memory, copies in every direction, streams, events,
failures — plus what is particular to them: devices ordered by worker
address, measured link attributes, copies that go worker to worker.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import devices
from devices import Device, Event, _remote_stream, remote
from devices._remote_session import Session
from devices.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotFoundError,
    RemoteError,
    StreamError,
    UnsupportedOperationError,
)
from devices.remote import RemoteCompletion, RemoteFunction
from scheduler.cost import AnalyticCostModel, speed_from_attributes
from tests import remote_kernels

distributed = pytest.importorskip("distributed")

R0, R1 = Device("remote", 0), Device("remote", 1)
TIMEOUT = 30.0
INCREMENT = RemoteFunction(remote_kernels.increment, (), "increment")
FAIL = RemoteFunction(remote_kernels.fail, (), "fail")
DOZE = RemoteFunction(remote_kernels.doze, (), "doze")


@pytest.fixture(scope="module")
def security(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Dask TLS with a throwaway self-signed certificate (``None`` where
    there is no openssl to make one: the module then runs over tcp)."""
    if shutil.which("openssl") is None:
        return None
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost"
    ca = "basicConstraints=critical,CA:TRUE"  # its own certificate authority
    subprocess.run(
        [*command.split(), "-keyout", str(key), "-out", str(cert), "-addext", ca],
        check=True,
        capture_output=True,
    )
    pem = {"cert": str(cert), "key": str(key)}
    return distributed.security.Security(
        tls_ca_file=pem["cert"],
        **{
            f"tls_{who}_{what}": pem[what]
            for who in ("client", "scheduler", "worker")
            for what in ("cert", "key")
        },
        require_encryption=True,
    )


@pytest.fixture(scope="module")
def conn(security: Any) -> Iterator[remote.Connection]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # any free port: 8787 may be taken
        protocol="tls" if security is not None else None,
        security=security,
    )
    try:
        address = cluster.scheduler_address
        with remote.connect(address, security=security) as connection:
            yield connection
    finally:
        cluster.close()


def _api() -> Any:
    return devices.get_api("remote")


def test_workers_are_devices_in_address_order(conn: remote.Connection) -> None:
    assert conn.devices == (R0, R1)
    assert list(conn.workers.values()) == sorted(conn.workers.values())
    assert devices.get_api("remote").device_count() == 2
    assert R1 in devices.list_devices()
    assert R0.exist and R1.exist


def test_measured_links_feed_the_cost_model(conn: remote.Connection) -> None:
    attrs = _api().attributes(R0)
    assert attrs["worker"] == conn.workers[R0]
    for name in (
        "flops",
        "host_bandwidth",
        "peer_bandwidth",
        "host_latency",
        "peer_latency",
    ):
        assert attrs[name] > 0, name
    speed = speed_from_attributes(R0, attrs)
    assert speed.peer is not None
    assert speed.peer.bandwidth == attrs["peer_bandwidth"]
    # Between two remote devices the model charges the peer links.
    import networkx as nx

    model = AnalyticCostModel.from_devices(nx.DiGraph(), [R0, R1])
    peers = [model.speeds[d].peer for d in (R0, R1)]
    expected = max(p.seconds(1 << 20) for p in peers if p is not None)
    assert model.transfer_time(1 << 20, R0, R1) == expected


@pytest.mark.parametrize("nbytes", [0, 1000, 5 << 20])
def test_host_round_trip(conn: remote.Connection, nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
    on_remote = devices.array(data, R0)
    assert on_remote.device == R0
    np.testing.assert_array_equal(on_remote.numpy(), data)


def test_copy_between_workers_goes_worker_to_worker(conn: remote.Connection) -> None:
    data = np.arange(100_000, dtype=np.float32)
    on_r0 = devices.array(data, R0)
    on_r1 = on_r0.copyto(R1)
    np.testing.assert_array_equal(on_r1.numpy(), data)

    def incoming(dask_worker: Any) -> list[tuple[str, list[str]]]:
        return [(e["who"], list(e["keys"])) for e in dask_worker.transfer_incoming_log]

    log = conn.client.run(incoming, workers=[conn.workers[R1]])[conn.workers[R1]]
    sent = [who for who, keys in log if any("asyncrt_send" in k for k in keys)]
    assert conn.workers[R0] in sent


def test_copy_within_one_device_and_to_sim(conn: remote.Connection) -> None:
    data = np.arange(64, dtype=np.int32)
    a = devices.array(data, R0)
    b = devices.empty((64,), "int32", R0).copyfrom(a)
    np.testing.assert_array_equal(b.numpy(), data)
    staged = a.copyto(Device("sim", 0)).copyto(R1)  # through the host
    np.testing.assert_array_equal(staged.numpy(), data)


@pytest.mark.anyio
async def test_stream_keeps_order_and_events_wake_the_loop(
    conn: remote.Connection,
) -> None:
    x = devices.array(np.zeros(4, dtype=np.float32), R0)
    y = devices.empty((4,), "float32", R1)
    arg = _api().view(x.buffer, 0, (4,), np.dtype("float32"))
    with _api().stream(R0) as s0, _api().stream(R1) as s1:
        for _ in range(10):
            s0.launch(INCREMENT, (arg,))  # one task each
        s0.launch_many([(INCREMENT, (arg,), 0.0)] * 5)  # one task for five
        ready = s0.record(Event("ready"))
        s1.wait_event(ready)  # worker side
        y.copyfrom(x, stream=s1)
        with anyio.fail_after(TIMEOUT):
            await s1.record().wait()
    np.testing.assert_array_equal(y.numpy(), np.full(4, 15, dtype=np.float32))


def test_failure_is_scoped_to_its_segment(conn: remote.Connection) -> None:
    x = devices.array(np.zeros(2, dtype=np.float32), R0)
    arg = _api().view(x.buffer, 0, (2,), np.dtype("float32"))
    with _api().stream(R0) as s0, _api().stream(R1) as s1:
        s0.launch_many([(INCREMENT, (arg,), 0.0), (FAIL, (arg,), 0.0)])
        s0.launch(INCREMENT, (arg,))  # skipped: same segment as the failure
        failed = s0.record()
        s1.wait_event(failed)
        inherited = s1.record()
        with pytest.raises(StreamError) as info:
            failed.synchronize(TIMEOUT)
        cause = _root(info.value)
        assert isinstance(cause, RemoteError)
        assert cause.type_name == "ValueError"
        assert cause.device == "remote:0"
        assert "failed on purpose" in str(cause)
        with pytest.raises(StreamError):
            inherited.synchronize(TIMEOUT)
        s0.launch(INCREMENT, (arg,))  # a new segment runs
        s0.synchronize(TIMEOUT)
    np.testing.assert_array_equal(x.numpy(), np.full(2, 2, dtype=np.float32))
    assert not _remote_stream._registry._live  # every call id was settled


def test_kernels_run_only_on_remote_streams(conn: remote.Connection) -> None:
    x = devices.empty((2,), "float32", R0)
    arg = _api().view(x.buffer, 0, (2,), np.dtype("float32"))
    with pytest.raises(UnsupportedOperationError, match="remote stream"):
        INCREMENT(arg)
    with _api().stream(R1) as s1:
        s1.launch(INCREMENT, (arg,))  # an array of remote:0 on remote:1
        with pytest.raises(StreamError, match="remote:0"):
            s1.synchronize(TIMEOUT)
    assert not _remote_stream._registry._live


def test_one_connection_at_a_time(conn: remote.Connection) -> None:
    with pytest.raises(DeviceError, match="already connected"):
        remote.connect(conn.client)


def test_unreachable_scheduler_is_device_not_found() -> None:
    with pytest.raises(DeviceNotFoundError, match="cannot connect"):
        Session.open("tcp://127.0.0.1:1", timeout=0.5)


def test_tls_is_used_and_required(conn: remote.Connection, security: Any) -> None:
    if security is None:
        pytest.skip("no openssl to make a certificate: the cluster runs over tcp")
    assert all(w.startswith("tls://") for w in conn.workers.values())
    address = conn.client.scheduler.address
    with pytest.raises(DeviceNotFoundError, match="needs security"):
        Session.open(address, timeout=2)


def test_closing_fails_waiters_and_removes_the_devices(
    conn: remote.Connection,
) -> None:
    """Last: it closes the module's connection."""
    with _api().stream(R0) as s0:
        s0.launch(DOZE, ())
        pending = s0.record()
        completion = pending.completion
        assert isinstance(completion, RemoteCompletion)
        assert completion.issued.wait(TIMEOUT)  # the task is on the cluster
        conn.close()
        with pytest.raises(StreamError) as info:
            pending.synchronize(TIMEOUT)  # at once, not after the doze
        assert isinstance(_root(info.value), DeviceLostError)
        assert "closed" in str(_root(info.value))
        s0.launch(DOZE, ())
        with pytest.raises(StreamError, match="closed"):
            s0.synchronize(TIMEOUT)
    assert devices.get_api("remote").device_count() == 0
    assert remote.connection() is None and not R0.exist


def _root(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error
