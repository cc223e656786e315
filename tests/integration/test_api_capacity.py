"""The API keeps answering under slow clients and many log followers.

The real `services.api.run` (gunicorn, gevent workers) is started from the
test on 127.0.0.1 and a free port, on the session's real Redis. Attackers are
raw sockets; the normal client is `requests`. Nothing is timed: each check
waits on what it observes, before a generous deadline.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from pai_cli.sse import Event, parse_events
from services.monitor.logs import append_log_entries
from shared.node.containers import TaskRef
from tests.support.api import config
from tests.support.api_process import DEADLINE_SECONDS, FOLLOWED, Api

pytestmark = pytest.mark.redis

SLOW_LORIS = 64
# More follows than the 2 workers x 16 threads the API used to have.
FOLLOWERS = 40


@pytest.fixture
def serve(redis_server: str, redis_client: redis.Redis,
          tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Start `pai-api` with some settings: `serve(**settings)`; stopped after the test."""
    started: list[Api] = []

    def start(**settings: str) -> Api:
        api = Api(redis_server, tmp_path, **settings)
        started.append(api)
        api.wait_ready()
        assert api.http.post(f"{api.url}/api/v1/jobs", json=config("followed"),
                             timeout=DEADLINE_SECONDS).status_code == 202
        return api

    try:
        yield start
    finally:
        for api in started:
            api.stop()


def status_line(sock: socket.socket) -> bytes:
    """The first line of the answer on `sock` (waits at most DEADLINE_SECONDS)."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (an EOF or a reset waits to be read)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(DEADLINE_SECONDS)


class Trickle:
    """Sends one header byte to each socket every half second, from a thread."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks, self.stop = socks, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.send(b"a")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=DEADLINE_SECONDS)


def test_slow_loris_and_many_followers_do_not_stop_the_api(serve: Callable[..., Api]) -> None:
    """Threat: 64 slow connections plus more log followers than the API has
    threads hold every request worker, and the API stops answering everyone."""
    api = serve(PAI_API_READ_TIMEOUT_SECONDS="300", PAI_API_FOLLOWS_PER_USER="100")
    loris = [api.raw_request(b"GET /api/v1/jobs HTTP/1.1\r\nHost: t\r\nX-Slow: ")
             for _ in range(SLOW_LORIS)]
    trickle = Trickle(loris)
    followers = [api.follow() for _ in range(FOLLOWERS)]
    try:
        assert {status_line(f) for f in followers} == {b"HTTP/1.1 200 OK"}

        listed = api.http.get(f"{api.url}/api/v1/jobs", timeout=DEADLINE_SECONDS)
        submitted = api.http.post(f"{api.url}/api/v1/jobs", json=config("meanwhile"),
                                  timeout=DEADLINE_SECONDS)

        assert listed.status_code == 200
        assert "followed" in {job["name"] for job in listed.json()}
        assert submitted.status_code == 202
        assert not any(closed_by_server(s) for s in loris), "the attack was still on"
        assert not any(closed_by_server(s) for s in followers)
    finally:
        trickle.close()
        for sock in loris + followers:
            sock.close()


def test_a_header_sent_a_byte_at_a_time_is_cut(serve: Callable[..., Api]) -> None:
    """Threat: a client that sends one header byte at a time holds its
    connection (and under threads, a worker) for as long as it likes."""
    api = serve(PAI_API_READ_TIMEOUT_SECONDS="1")
    sock = api.raw_request(b"GET /api/v1/jobs HTTP/1.1\r\nHost: t\r\nX-Slow: ")

    deadline, cut = time.monotonic() + DEADLINE_SECONDS, False
    while not cut and time.monotonic() < deadline:
        try:
            sock.send(b"a")
        except OSError:
            cut = True
            break
        cut = closed_by_server(sock)
        time.sleep(0.2)  # the attacker's pace, not a wait for the server
    sock.close()

    assert cut, "the server never closed the trickling connection"


def test_a_body_sent_a_byte_at_a_time_gets_408_and_is_closed(serve: Callable[..., Api]) -> None:
    """Threat: a client that announces a body and trickles it holds its connection."""
    api = serve(PAI_API_READ_TIMEOUT_SECONDS="1")
    sock = api.raw_request(b"POST /api/v1/token HTTP/1.1\r\nHost: t\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    answer, deadline = b"", time.monotonic() + DEADLINE_SECONDS
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            sock.send(b" ")  # the attacker's pace
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        answer += chunk
    sock.close()

    assert answer.startswith(b"HTTP/1.1 408"), answer


def test_follows_over_the_cap_get_429_with_retry_after_until_one_closes(
        serve: Callable[..., Api], redis_client: redis.Redis) -> None:
    """Threat: one user opens follows across the API's processes until no
    connection is left; beyond the cap they get 429 and when to retry."""
    api = serve(PAI_API_FOLLOWS_PER_USER="2")
    held = [api.follow() for _ in range(2)]
    assert [status_line(f) for f in held] == [b"HTTP/1.1 200 OK"] * 2

    refused = api.http.get(f"{api.url}{FOLLOWED}", timeout=DEADLINE_SECONDS)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "TooManyRequestsError"
    assert int(refused.headers["Retry-After"]) > 0

    held.pop().close()
    task, line = TaskRef("root~followed", 0, "main", 0), 0
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        # The server finds a follower gone when it writes to it: give it lines.
        line += 1
        append_log_entries(redis_client, task, [f"line {line}"], 1000)
        with api.http.get(f"{api.url}{FOLLOWED}", timeout=DEADLINE_SECONDS,
                          stream=True) as again:
            if again.status_code == 200:
                break
            assert again.status_code == 429
        time.sleep(0.1)
    else:
        pytest.fail("the closed follow never gave its lease back")
    for sock in held:
        sock.close()


def test_followers_of_one_log_each_get_every_line_once_in_order(
        serve: Callable[..., Api], redis_client: redis.Redis) -> None:
    """Followers of one log share one reader per process: none may miss a line,
    see one twice, or see them out of order, whenever it joined."""
    api = serve()
    task = TaskRef("root~followed", 0, "main", 0)
    append_log_entries(redis_client, task, ["line 1"], 1000)
    got: dict[int, list[Event]] = {}

    def follow(n: int) -> None:
        with api.http.get(f"{api.url}{FOLLOWED}", stream=True,
                          timeout=DEADLINE_SECONDS) as resp:
            got[n] = list(parse_events(line.decode() for line in resp.iter_lines()))

    threads = [threading.Thread(target=follow, args=(n,)) for n in range(3)]
    threads[0].start()
    for n in range(2, 41):
        append_log_entries(redis_client, task, [f"line {n}"], 1000)
        if n in (10, 20):
            threads[n // 10].start()  # joining while lines flow
    deadline = time.monotonic() + DEADLINE_SECONDS
    while redis_client.zcard("pai:follows:root") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.http.put(f"{api.url}/api/v1/user/root/jobs/followed/executionType",
                        json={"value": "STOP"}, timeout=DEADLINE_SECONDS).status_code == 202
    for thread in threads:
        thread.join(timeout=DEADLINE_SECONDS)

    expected = [Event("message", f"line {n}") for n in range(1, 41)] + [Event("end", "")]
    assert got == {0: expected, 1: expected, 2: expected}


def test_a_chunked_body_over_the_limit_is_413_not_cut_short(serve: Callable[..., Api]) -> None:
    """Threat (docs/security.md, client → API): a body sent chunked (no
    Content-Length) past the 1 MiB limit was silently cut to the limit and
    parsed as if whole. Under the real server it is refused with 413."""
    api = serve()

    def chunks() -> Iterator[bytes]:
        yield b'{"jobName": "big", "extras": {"pad": "'
        for _ in range(2 * 1024):
            yield b"x" * 1024
        yield b'"}}'

    resp = api.http.post(f"{api.url}/api/v1/jobs", data=chunks(), timeout=DEADLINE_SECONDS,
                         headers={"Content-Type": "application/json"})
    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "RequestEntityTooLargeError"


def test_an_upload_longer_than_the_body_deadline_goes_through_while_bytes_flow(
        serve: Callable[..., Api], tmp_path: Path) -> None:
    """A WebHDFS upload may take longer than PAI_API_READ_TIMEOUT_SECONDS (it
    may be gigabytes): each read of up to a MiB has the seconds to itself."""
    api = serve(PAI_API_READ_TIMEOUT_SECONDS="1")
    chunks = [bytes([n]) * 256 * 1024 for n in range(12)]  # 3 MiB
    auth = str(api.http.headers["Authorization"])
    sock = api.raw_request(
        f"PUT /webhdfs/v1{tmp_path}/root/slow.bin?op=CREATE&data=true HTTP/1.1\r\n"
        f"Host: t\r\nAuthorization: {auth}\r\n"
        f"Content-Length: {sum(map(len, chunks))}\r\n\r\n".encode())
    for chunk in chunks:  # a MiB per 0.6 s, 1.8 s in all: past the 1 s body deadline
        sock.sendall(chunk)
        time.sleep(0.15)  # the client's pace, not a wait for a state
    assert status_line(sock).startswith(b"HTTP/1.1 201 ")
    sock.close()
    assert (tmp_path / "root" / "slow.bin").read_bytes() == b"".join(chunks)


def test_an_upload_that_stops_sending_is_cut(serve: Callable[..., Api],
                                             tmp_path: Path) -> None:
    """Threat: an upload that announces a body and then sends nothing more
    holds its connection; each read's timeout cuts it."""
    api = serve(PAI_API_READ_TIMEOUT_SECONDS="1")
    auth = str(api.http.headers["Authorization"])
    sock = api.raw_request(
        f"PUT /webhdfs/v1{tmp_path}/root/stalled.bin?op=CREATE&data=true HTTP/1.1\r\n"
        f"Host: t\r\nAuthorization: {auth}\r\nContent-Length: 100000\r\n\r\n".encode()
        + b"x" * 10)
    sock.settimeout(DEADLINE_SECONDS)
    answer = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(4096):
            answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
