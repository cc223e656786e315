"""Interactive exec: a terminal over a WebSocket, through Redis and the node's
launcher into a real container's TTY.

The API is served on a free 127.0.0.1 port (werkzeug's threaded server, as
Flask's own), the node's launcher reads its node's calls on a thread, and
the task's container runs on the test Docker engine (tests/integration/
test_execs.py's setting, whose `run_task` this reuses).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import docker
import pytest
import redis
from simple_websocket import Client, ConnectionClosed, ConnectionError

from pai_cli.logins import Cluster, Logins, save
from services.api import exectty as api_exectty
from services.api.app import create_app
from services.api.auth import issue_token
from services.api.follows import FollowLeases
from services.launcher.service import Launcher
from services.launcher.worker import create_launcher_app
from shared.infra.config import Settings
from shared.node.containers import LABEL_NODE, TaskRef
from shared.state import execsessions, keys, telemetry
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.api import AuthedClient, served
from tests.support.api_process import Api
from tests.support.launcher_rig import run_task, serving_calls

pytestmark = [pytest.mark.docker, pytest.mark.redis]

WAIT_SECONDS = 30
# A job name of this run's own: containers are named after their task, and
# other checkouts' tests share the Docker engine (test_execs.py's job among them).
JOB = f"tty-{uuid.uuid4().hex[:8]}"
PATH = f"/api/v1/user/alice/jobs/{JOB}/tasks/main/0/exec"
# busybox's shell prints its prompt, then asks where the cursor is (ESC [6n); a
# line typed right behind a terminal's answer is lost, so the tests, as a dumb
# terminal, do not answer, and type once the prompt is there.
PROMPT = b"# "


@pytest.fixture
def settings(request: pytest.FixtureRequest, redis_server: str, redis_client: redis.Redis,
             tmp_path: Path, docker_client: docker.DockerClient,
             test_image: str) -> Iterator[Settings]:
    """The node's and the API's settings (a test may change some: indirect parameters)."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    yield Settings(redis_url=redis_server, node_name=node, node_ip="127.0.0.1",
                   storage_roots=(str(tmp_path),), docker_host=os.environ.get("DOCKER_HOST"),
                   admin_user="root", admin_password="root-password",
                   **getattr(request, "param", {}))
    for container in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_NODE}={node}"}):
        container.remove(force=True)


@pytest.fixture
def launcher(settings: Settings, test_labels: dict[str, str]) -> Iterator[Launcher]:
    """The node's launcher, reading its node's calls."""
    _, launcher = create_launcher_app(settings, extra_labels=test_labels)
    launcher.store.register_node(launcher.node)
    with serving_calls(launcher):
        yield launcher


@pytest.fixture
def running(redis_client: redis.Redis, launcher: Launcher, alice: AuthedClient,
            test_image: str) -> str:
    return run_task(Store(redis_client), launcher, test_image, name=JOB)


@pytest.fixture
def api(settings: Settings) -> Iterator[str]:
    """The API's base URL."""
    with served(create_app(settings)) as url:
        yield url


def connect(base: str, who: AuthedClient, query: str = "tty=1", **args: Any) -> Client:
    """A WebSocket to the task; `args` (a list: the parameter repeated) join the query."""
    if args:
        query += "&" + urlencode(args, doseq=True)
    return Client.connect(f"{base.replace('http', 'ws', 1)}{PATH}?{query}",
                          headers=who.headers)


def refused(base: str, who: AuthedClient, query: str = "tty=1") -> int:
    """The HTTP status the upgrade was refused with."""
    with pytest.raises(ConnectionError) as error:
        connect(base, who, query).close()
    return int(error.value.status_code)


@dataclasses.dataclass
class Screen:
    """What a terminal client received: the bytes, and the control messages."""

    ws: Client
    output: bytes = b""
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def until(self, done: Callable[[Screen], bool], seconds: float = WAIT_SECONDS) -> Screen:
        deadline = time.monotonic() + seconds
        while not done(self):
            left = deadline - time.monotonic()
            assert left > 0, f"not seen in time; output {self.output!r}, {self.messages}"
            try:
                message = self.ws.receive(timeout=min(left, 1.0))
            except ConnectionClosed:
                assert done(self), f"closed first; output {self.output!r}, {self.messages}"
                return self
            if isinstance(message, bytes):
                self.output += message
            elif message is not None:
                self.messages.append(json.loads(message))
        return self

    def shows(self, text: bytes) -> Screen:
        return self.until(lambda s: text in s.output)

    def exit(self) -> dict[str, Any]:
        self.until(lambda s: any(m["type"] in ("exit", "error") for m in s.messages))
        return next(m for m in self.messages if m["type"] in ("exit", "error"))


def shell(base: str, who: AuthedClient, **start: Any) -> Screen:
    ws = connect(base, who)
    ws.send(json.dumps({"type": "start", **start}))
    return Screen(ws)


def session_keys(r: redis.Redis) -> list[str]:
    return [str(k) for k in r.scan_iter(match=f"{keys.PREFIX}exec-tty*")]


# ------------------------------------------------------------------ tests


def test_a_terminal_echoes_a_line_and_delivers_its_exit_code(
        api: str, running: str, alice: AuthedClient, redis_client: redis.Redis) -> None:
    screen = shell(api, alice, cols=80, rows=24)  # the image's /bin/sh
    screen.shows(PROMPT)
    screen.ws.send(b"echo hi\n")
    screen.shows(b"\r\nhi\r\n")  # the TTY echoes the line, then the program's output
    screen.ws.send(b"exit 3\n")

    assert screen.exit() == {"type": "exit", "exitCode": 3, "reason": "exited"}
    events = Store(redis_client).get_events(running)
    opened = next(e for e in events if e["kind"] == "exec-session")
    assert (opened["user"], opened["role"], opened["index"], opened["argv"]) == \
        ("alice", "main", 0, ["/bin/sh"])
    deadline = time.monotonic() + WAIT_SECONDS
    while not any(e["kind"] == "exec-session-end" for e in events):
        assert time.monotonic() < deadline, events
        time.sleep(0.05)
        events = Store(redis_client).get_events(running)
    ended = next(e for e in events if e["kind"] == "exec-session-end")
    assert (ended["session"], ended["exitCode"], ended["reason"]) == \
        (opened["session"], 3, "exited")
    assert ended["durationSec"] >= 0
    [recorded] = telemetry.read_recorded(redis_client, [telemetry.TASK_EXEC_SESSIONS])
    assert recorded.counters == {("alice",): 1.0}


def test_the_command_from_the_query_and_its_exit_code(api: str, running: str,
                                                      alice: AuthedClient) -> None:
    ws = connect(api, alice, command=["sh", "-c", "tty; exit 7"])
    screen = Screen(ws)

    assert screen.exit() == {"type": "exit", "exitCode": 7, "reason": "exited"}
    assert b"/dev/pts/" in screen.output  # a real terminal


def test_resize_reaches_the_process(api: str, running: str, alice: AuthedClient) -> None:
    screen = shell(api, alice, cols=100, rows=30)
    screen.shows(PROMPT)
    screen.ws.send(b"stty size\n")
    screen.shows(b"30 100")
    screen.ws.send(json.dumps({"type": "resize", "cols": 123, "rows": 45}))
    screen.ws.send(b"stty size\n")
    screen.shows(b"45 123")
    screen.ws.send(b"exit\n")
    assert screen.exit()["exitCode"] == 0


def test_an_admin_may_and_another_user_may_not(api: str, running: str, alice: AuthedClient,
                                               bob: AuthedClient, admin: AuthedClient) -> None:
    assert refused(api, bob) in (403, 404)
    screen = Screen(connect(api, admin, command=["sh", "-c", "exit 5"]))
    assert screen.exit()["exitCode"] == 5


def test_bad_requests_are_refused_before_the_upgrade(api: str, running: str,
                                                     alice: AuthedClient) -> None:
    assert refused(api, alice, "tty=0") == 400
    assert refused(api, alice, "tty=1&cols=0") == 400
    assert refused(api, alice, "tty=1&command=") == 400
    assert refused(api, AuthedClient(alice.client, "not-a-token")) == 401
    plain = alice.get(f"{PATH}?tty=1")  # no Upgrade: the POST is the one-shot command
    assert plain.status_code == 400 and "WebSocket" in plain.json["message"]
    broken = alice.get(f"{PATH}?tty=1", headers={"Upgrade": "websocket",
                                                  "Connection": "Upgrade"})  # no key
    assert broken.status_code == 400 and "handshake" in broken.json["message"]


def test_the_first_message_starts_the_session(api: str, running: str,
                                              alice: AuthedClient) -> None:
    bad = shell(api, alice, command=[])  # an empty argv: refused, nothing started
    assert (bad.exit()["type"], bad.exit()["status"]) == ("error", 400)

    keys_first = Screen(connect(api, alice))  # keystrokes first: the image's /bin/sh
    keys_first.ws.send(b"exit 9\n")
    assert keys_first.exit() == {"type": "exit", "exitCode": 9, "reason": "exited"}


def test_a_finished_task_is_refused(api: str, running: str, alice: AuthedClient,
                                    redis_client: redis.Redis) -> None:
    assert record_task_exit(Store(redis_client), running, 0, "main", 0, exit_code=0) is not None
    assert refused(api, alice) == 409


def test_a_user_past_the_cap_gets_429(api: str, running: str, alice: AuthedClient,
                                      settings: Settings, redis_client: redis.Redis) -> None:
    leases = FollowLeases(Store(redis_client), settings.exec_tty_per_user,
                          key=keys.exec_tty_leases)
    held = [leases.acquire("alice") for _ in range(settings.exec_tty_per_user)]
    assert all(held)

    assert refused(api, alice) == 429
    leases.release("alice", str(held[0]))
    screen = Screen(connect(api, alice, command=["true"]))
    assert screen.exit()["exitCode"] == 0


@pytest.mark.parametrize("settings", [{"exec_tty_per_user": 1}], indirect=True)
def test_a_session_s_lease_is_back_before_its_end_is_told(
        api: str, running: str, alice: AuthedClient, redis_client: redis.Redis) -> None:
    """A client that heard its session end may open the next at once, even
    at a cap of one: the lease (and this process's slot) go back before the
    last message is sent."""
    for code in (0, 3):
        screen = Screen(connect(api, alice, command=["sh", "-c", f"exit {code}"]))
        assert screen.exit() == {"type": "exit", "exitCode": code, "reason": "exited"}
        assert redis_client.zcard(keys.exec_tty_leases("alice")) == 0
    screen = Screen(connect(api, alice, query="tty=1&command=cat&command=/nonexistent"))
    assert screen.exit()["exitCode"] == 1
    assert redis_client.zcard(keys.exec_tty_leases("alice")) == 0


def test_an_idle_session_closes(settings: Settings, running: str,
                                alice: AuthedClient) -> None:
    with served(create_app(dataclasses.replace(settings, exec_idle_seconds=1.0))) as url:
        screen = shell(url, alice, command=["sleep", "300"])
        end = screen.exit()
        assert (end["type"], end["reason"]) == ("exit", "idle")


@pytest.mark.parametrize("settings", [{"exec_tty_slots_per_node": 1}], indirect=True)
def test_a_node_full_of_terminals_still_runs_execs(api: str, running: str,
                                                   alice: AuthedClient) -> None:
    first = shell(api, alice, command=["sh"])
    first.shows(PROMPT)

    second = shell(api, alice, command=["sh"])
    refusal = second.exit()
    assert (refusal["type"], refusal["status"]) == ("error", 503)
    # the non-interactive exec and its pool are not the terminals'
    answer = alice.post(PATH, json={"command": ["echo", "still"]})
    assert answer.status_code == 200 and answer.json["output"] == "still\n"

    first.ws.send(b"exit\n")
    assert first.exit()["reason"] == "exited"


def test_a_client_flooding_a_program_that_does_not_read_is_cut_off(
        api: str, running: str, alice: AuthedClient, launcher: Launcher,
        redis_client: redis.Redis) -> None:
    """Back-pressure from the task to the API: nothing is buffered without bound."""
    screen = shell(api, alice, command=["sleep", "4322"])  # never reads its terminal
    chunk = b"x" * 64_000
    sent = 0
    with contextlib.suppress(ConnectionClosed, OSError):  # closed, as it should be
        while sent < 2000:  # 128 MB at most; the cut-off comes after a few MB
            screen.ws.send(chunk)
            sent += 1
    end = screen.exit()
    assert (end["type"], end["status"]) == ("error", 429), end
    assert sent < 2000
    # the program goes, and every key
    deadline = time.monotonic() + WAIT_SECONDS
    while runs(launcher, running, "sleep 4322") or session_keys(redis_client):
        assert time.monotonic() < deadline, session_keys(redis_client)
        time.sleep(0.2)


def test_a_client_that_stops_reading_is_let_go(
        api: str, running: str, alice: AuthedClient, launcher: Launcher,
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that keeps its connection open but reads nothing holds neither
    the session, its lease, nor the program for longer than a send may take."""
    monkeypatch.setattr(api_exectty, "SEND_TIMEOUT_SECONDS", 2.0)
    host, port = api.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_SECONDS)
    sock.connect((host, int(port)))
    try:
        query = urlencode({"tty": 1, "command": ["sh", "-c", "echo flood; yes"]}, doseq=True)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET {PATH}?{query} HTTP/1.1\r\nHost: {host}\r\n"
                     "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                     f"Authorization: {alice.headers['Authorization']}\r\n\r\n".encode())
        assert sock.recv(12) == b"HTTP/1.1 101"  # and then it reads no more
        # the kernel's buffers on the way take megabytes before a send stalls
        deadline = time.monotonic() + 4 * WAIT_SECONDS
        while not (ended := session_ends(redis_client, running)):
            assert time.monotonic() < deadline, processes(launcher, running)
            time.sleep(0.2)
        assert ended[0]["reason"] == "client-gone"
        assert "yes" not in processes(launcher, running)
        while session_keys(redis_client) or redis_client.zcard(keys.exec_tty_leases("alice")):
            assert time.monotonic() < deadline, session_keys(redis_client)
            time.sleep(0.2)
    finally:
        sock.close()


def session_ends(r: redis.Redis, job_id: str) -> list[dict[str, Any]]:
    return [e for e in Store(r).get_events(job_id) if e["kind"] == "exec-session-end"]


def processes(launcher: Launcher, job_id: str) -> list[str]:
    """The commands running in the task's container (Docker's top: no exec)."""
    container = launcher.runtime.find(TaskRef(job_id, 0, "main", 0))
    assert container is not None
    top = container.top(ps_args="-o pid,args")
    return [p[-1] for p in top.get("Processes") or []]


def runs(launcher: Launcher, job_id: str, command: str) -> bool:
    """Whether a process of the task's container runs `command`. Read through
    Docker's top, not an exec of `ps` in the container: after a flooded
    terminal is cut off, an exec into that container could wait on the
    engine for as long as the flood's copy did (a CI run hung there)."""
    return any(command in args for args in processes(launcher, job_id))


def test_a_vanished_client_leaves_no_process_and_no_keys(
        api: str, running: str, alice: AuthedClient, launcher: Launcher,
        redis_client: redis.Redis) -> None:
    screen = shell(api, alice, command=["sh", "-c", "echo ready; sleep 4321"])
    screen.shows(b"ready")
    assert runs(launcher, running, "sleep 4321")
    assert redis_client.zcard(keys.exec_tty_leases("alice")) == 1

    screen.ws.sock.shutdown(socket.SHUT_RDWR)  # the client vanishes: no close frame
    screen.ws.sock.close()

    deadline = time.monotonic() + WAIT_SECONDS
    while runs(launcher, running, "sleep 4321") \
            or session_keys(redis_client) or redis_client.zcard(keys.exec_tty_leases("alice")):
        assert time.monotonic() < deadline, (processes(launcher, running),
                                             session_keys(redis_client))
        time.sleep(0.2)


def test_more_output_entries_than_the_stream_keeps_all_arrive(
        api: str, running: str, alice: AuthedClient) -> None:
    """Each keystroke's echo is an output entry of its own: past
    OUTPUT_MAX_ENTRIES of them the session goes on only if the API deletes
    what it sent (in batches) and the launcher finds room again."""
    screen = Screen(connect(api, alice, command=["cat"]))
    rounds = execsessions.OUTPUT_MAX_ENTRIES + 2 * api_exectty.DELETE_BATCH
    for n in range(rounds):
        key = bytes([ord("a") + n % 26])
        screen.output = b""
        screen.ws.send(key)
        screen.shows(key)
    screen.ws.close()


@pytest.mark.parametrize("settings", [{"api_worker_connections": 4}], indirect=True)
def test_sessions_one_after_another_give_their_connections_back(
        api: str, running: str, alice: AuthedClient) -> None:
    """With room for one session (its two connections held for its life),
    each session after the first needs the connections the last one gave
    back."""
    for n in range(3):
        ws = connect(api, alice, command=["sh", "-c", f"echo session-{n}; exit {n}"])
        screen = Screen(ws)
        assert screen.exit() == {"type": "exit", "exitCode": n, "reason": "exited"}
        assert f"session-{n}".encode() in screen.output


def test_a_terminal_under_gunicorn_s_gevent_worker(running: str, alice: AuthedClient,
                                                   redis_server: str, tmp_path: Path) -> None:
    """The API as it is deployed (services.api.run: gunicorn, gevent workers)."""
    deployed = Api(redis_server, tmp_path)
    try:
        deployed.wait_ready()
        screen = shell(deployed.url, alice, command=["sh"])
        screen.shows(PROMPT)
        screen.ws.send(b"echo hi\n")
        screen.shows(b"\r\nhi\r\n")
        screen.ws.send(b"exit 6\n")
        assert screen.exit() == {"type": "exit", "exitCode": 6, "reason": "exited"}
        # the worker goes on serving requests after the WebSocket closed
        assert deployed.http.get(f"{deployed.url}/api/v1/jobs", timeout=WAIT_SECONDS).ok
    finally:
        deployed.stop()


# ------------------------------------------------------------------ the CLI


REPO = Path(__file__).resolve().parents[2]


def cli_config(tmp_path: Path, base: str, username: str) -> Path:
    """A CLI config logged in to the API as `username`."""
    with create_app(Settings(redis_url="redis://127.0.0.1:1", admin_user="root",
                             admin_password="root-password")).app_context():
        token, expires = issue_token(username, 86400)
    config = tmp_path / f"{username}.yaml"
    logins = Logins()
    logins.put(Cluster("test", base, username, token, False, expires))
    save(config, logins)
    return config


def set_window(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Pty:
    """`pai` on a pseudo-terminal, as a person at a terminal runs it."""

    def __init__(self, args: list[str], config: Path, cols: int, rows: int) -> None:
        self.master, self.slave = pty.openpty()
        set_window(self.slave, cols, rows)
        self.cooked = termios.tcgetattr(self.slave)
        env = {**os.environ, "PAI_CONFIG": str(config),
               "PYTHONPATH": f"{REPO / 'cli'}{os.pathsep}{REPO}"}
        env.pop("PAI_CLUSTER", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "pai_cli.main", *args],
                                     stdin=self.slave, stdout=self.slave, stderr=self.slave,
                                     env=env)
        self.output = b""

    def shows(self, text: bytes, seconds: float = WAIT_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, self.output
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                self.output += os.read(self.master, 65536)
            else:
                assert self.proc.poll() is None, self.output  # ended, and said nothing more

    def type(self, text: bytes) -> None:
        os.write(self.master, text)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT_SECONDS)
        os.close(self.master)
        os.close(self.slave)


def test_pai_exec_it_through_a_pty(api: str, running: str, alice: AuthedClient,
                                   tmp_path: Path) -> None:
    term = Pty(["exec", "-it", JOB, "--", "sh"], cli_config(tmp_path, api, "alice"),
               cols=111, rows=33)
    try:
        term.shows(PROMPT)  # the shell's prompt: it reads its input now
        term.type(b"stty size\r")  # raw mode here: Enter is CR, the task's TTY makes it NL
        term.shows(b"33 111")
        assert not termios.tcgetattr(term.slave)[3] & termios.ECHO  # raw: no local echo

        set_window(term.slave, 132, 41)
        term.proc.send_signal(signal.SIGWINCH)  # as the kernel does for the foreground
        term.type(b"stty size\r")
        term.shows(b"41 132")

        term.type(b"exit 4\r")
        assert term.proc.wait(timeout=WAIT_SECONDS) == 4
        assert termios.tcgetattr(term.slave) == term.cooked  # the terminal restored
    finally:
        term.close()


def test_pai_exec_it_says_why_it_was_refused(api: str, running: str, bob: AuthedClient,
                                             tmp_path: Path) -> None:
    term = Pty(["exec", "-it", "--user", "alice", JOB], cli_config(tmp_path, api, "bob"),
               cols=80, rows=24)
    try:
        assert term.proc.wait(timeout=WAIT_SECONDS) == 1
        term.shows(b"error:")
        assert termios.tcgetattr(term.slave) == term.cooked
    finally:
        term.close()
