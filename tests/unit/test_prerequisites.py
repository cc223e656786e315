"""Data, output and script prerequisites (shared/domain/prerequisites.py), their
v2 conversion and rendering (shared/domain/jobspec_v2.py), and the runner's
shell text (services/launcher/prerequisites.py), as tables; the runner's
fetch and upload helpers run here with the host's sh against a stand-in
WebHDFS endpoint (no HDFS name node can run on these machines)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
import yaml

from services.launcher.prerequisites import _HELPERS, COMMANDS, RUNNER, runner_for
from services.monitor.observations import describe_exit
from shared.domain import prerequisites
from shared.domain.jobspec import InvalidJobConfig, validate_job_config
from shared.domain.jobspec_v2 import convert_v2
from shared.domain.models import JobSpec
from shared.domain.prerequisites import (
    BARRIER_EXIT,
    FIRST_STEP_EXIT,
    Location,
    Prerequisite,
    PrerequisiteError,
    Source,
    failed_step,
    from_v2,
    locate,
    plan,
    step_labels,
)
from shared.domain.ssh import InvalidSshRequest, normalized
from shared.node.containers import LABEL_PREREQUISITES

ROOTS = ["/nfs"]
WEBHDFS = "http://namenode:9870"


@pytest.mark.parametrize(("uri", "expected"), [
    pytest.param("https://x.org/a/b.tar.gz", Location(Source.HTTP, url="https://x.org/a/b.tar.gz"),
                 id="https"),
    pytest.param("webhdfs://nn:50070/data/set", Location(
        Source.WEBHDFS, url="http://nn:50070/webhdfs/v1/data/set"), id="webhdfs"),
    pytest.param("swebhdfs://nn:9871/x", Location(
        Source.WEBHDFS, url="https://nn:9871/webhdfs/v1/x"), id="swebhdfs is https"),
    pytest.param("hdfs://nn:9000/core/model", Location(
        Source.WEBHDFS, url=f"{WEBHDFS}/webhdfs/v1/core/model"), id="hdfs through the endpoint"),
    pytest.param("webhdfs://nn:50070/a b", Location(
        Source.WEBHDFS, url="http://nn:50070/webhdfs/v1/a%20b"), id="path quoted"),
    pytest.param("/nfs/alice/data", Location(Source.STORAGE, path="/nfs/alice/data"),
                 id="a storage path"),
    pytest.param("file:///nfs//alice/./d/", Location(Source.STORAGE, path="/nfs/alice/d"),
                 id="file:// normalised"),
])
def test_locate(uri: str, expected: Location) -> None:
    assert locate(uri, ROOTS, WEBHDFS) == expected


@pytest.mark.parametrize(("uri", "why"), [
    pytest.param("hdfs://nn:9000/x", "PAI_HDFS_WEBHDFS_URL", id="hdfs without an endpoint"),
    pytest.param("/etc/passwd", "storage roots", id="outside every root"),
    pytest.param("/nfs/alice/../bob", "'..'", id="dot dot"),
    pytest.param("git@github.com:x/y.git", "neither", id="not a URI pai reaches"),
    pytest.param("ftp://x/y", "neither", id="ftp"),
    pytest.param("http:///nohost", "no host", id="no host"),
    pytest.param("", "non-empty", id="empty"),
])
def test_locate_refuses(uri: str, why: str) -> None:
    with pytest.raises(PrerequisiteError, match=why):
        locate(uri, ROOTS)


def test_callbacks_of_the_cmd_plugin_become_commands_before_and_after() -> None:
    found = from_v2({"name": "git", "type": "script", "plugin": prerequisites.CMD_PLUGIN,
                     "callbacks": [{"event": "taskStarts", "commands": ["apt update", "x"]},
                                   {"event": "taskSucceeds", "commands": ["y"]}]})
    assert (found.on_start, found.on_success, found.uris) == (("apt update", "x"), ("y",), ())


@pytest.mark.parametrize(("item", "why"), [
    pytest.param({"name": "a", "type": "data", "plugin": "other"}, "runs", id="other plugin"),
    pytest.param({"name": "a", "type": "data", "callbacks": [{"event": "taskFails"}]},
                 "taskStarts or taskSucceeds", id="an event pai has no hook for"),
    pytest.param({"name": "a", "type": "data"}, "nothing to run", id="nothing to do"),
    pytest.param({"name": "../x", "type": "data", "uri": "/nfs/a"}, "names a folder",
                 id="a name that is no folder name"),
    pytest.param({"name": "o", "type": "output", "uri": ["/nfs/a", "/nfs/b"]}, "one uri",
                 id="two outputs"),
    pytest.param({"name": "a", "type": "data", "uri": 3}, "strings", id="a uri not a string"),
    pytest.param({"name": "a", "type": "data", "uri": "/x", "failurePolicy": "retry"},
                 "failurePolicy", id="unknown failure policy"),
])
def test_prerequisites_refused(item: dict[str, Any], why: str) -> None:
    with pytest.raises(PrerequisiteError, match=why):
        from_v2(item)


def test_a_plan_orders_steps_and_gives_each_its_exit_code() -> None:
    data = Prerequisite("mnist", "data", ("https://x/m.tgz", "/nfs/alice/labels"))
    setup = Prerequisite("setup", "script", on_start=("pip install x",), on_success=("bye",))
    model = Prerequisite("model", "output", ("webhdfs://nn:50070/out",))
    mine = Prerequisite("mine", "output", ("/nfs/alice/out",))
    made = plan([data, setup, model, mine], ROOTS)
    assert [(s.prerequisite.name, s.phase) for s in made.steps] == [
        ("mnist", "fetch"), ("setup", "start"), ("setup", "success"), ("model", "upload")]
    label = step_labels(made.steps)
    assert failed_step(FIRST_STEP_EXIT, label) == \
        "data prerequisite mnist: fetching its uri failed"
    assert failed_step(FIRST_STEP_EXIT + 3, label) == \
        "output prerequisite model: uploading its folder failed"
    assert failed_step(FIRST_STEP_EXIT + 4, label) is None  # no such step: the code is theirs
    assert failed_step(BARRIER_EXIT, "") == \
        "the SSH barrier: not every task's sshd answered in time"
    assert failed_step(FIRST_STEP_EXIT, None) is None  # no runner: every code is the job's


def test_a_task_without_the_runner_keeps_its_own_exit_codes() -> None:
    assert describe_exit({"ExitCode": 201}).diagnostics == "exit code 201"
    runner = {LABEL_PREREQUISITES: "data prerequisite d: fetching its uri\nx"}
    assert describe_exit({"ExitCode": 200}, labels=runner).diagnostics.startswith(
        "exit code 200: data prerequisite d: fetching its uri failed")


def test_plan_refuses_what_it_cannot_run() -> None:
    with pytest.raises(PrerequisiteError, match="same name"):
        plan([Prerequisite("d", "data", ("https://a/x.csv", "https://b/x.csv"))], ROOTS)
    with pytest.raises(PrerequisiteError, match="at most"):
        plan([Prerequisite(f"s{i}", "script", on_start=("x",)) for i in range(41)], ROOTS)


# ---------------------------------------------------------------- v2 conversion


V2: dict[str, Any] = {
    "protocolVersion": 2, "name": "tf", "type": "job",
    "prerequisites": [
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "cifar10", "type": "data", "version": "latest",
         "uri": ["https://data.example/cifar-10.tar.gz"]},
        {"name": "model", "type": "output", "uri": "hdfs://nn:9000/core/model"},
        {"name": "bench", "type": "script", "version": "8482093",
         "uri": "https://git.example/benchmarks"},
        {"name": "tools", "type": "script", "plugin": prerequisites.CMD_PLUGIN,
         "callbacks": [{"event": "taskStarts", "commands": ["echo tools"]}]}],
    "taskRoles": {"worker": {
        "dockerImage": "img", "data": "cifar10", "output": "model", "script": "bench",
        "prerequisites": ["tools", "cifar10"],
        "resourcePerInstance": {"cpu": 1, "memoryMB": 256},
        "commands": ["git clone <% $script.uri %> s && cd s && git checkout "
                     "<% $script.version %>",
                     "wget <% $data.uri[0] %> -O data_<% $data.name %>.tgz",
                     "echo <% $output.uri %> <% $data.nothing %> <% $data.uri[5] %>"]}},
}


def test_v2_prerequisites_are_stored_on_the_role_and_rendered_in_commands() -> None:
    converted = convert_v2(V2, username="alice", storage_roots=["/nfs"],
                           hdfs_webhdfs_url=WEBHDFS)
    role = converted.config["taskRoles"][0]
    assert [(p["name"], p["type"]) for p in role["prerequisites"]] == [
        ("cifar10", "data"), ("model", "output"), ("bench", "script"), ("tools", "script")]
    assert role["command"].splitlines() == [
        "git clone https://git.example/benchmarks s && cd s && git checkout 8482093",
        "wget https://data.example/cifar-10.tar.gz -O data_cifar10.tgz",
        "echo hdfs://nn:9000/core/model <% $data.nothing %> <% $data.uri[5] %>"]
    # acted on, but for `version`, which only commands may render
    assert [f for f in converted.ignored if "prerequisites" in f] == [
        "prerequisites.1.version", "prerequisites.3.version"]
    spec = JobSpec.from_config(converted.config)
    assert spec.role("worker").prerequisites[3].on_start == ("echo tools",)


def test_the_ssh_barrier_is_stored_and_checked() -> None:
    assert normalized({"jobssh": True, "sshbarrier": True}) == {"jobssh": True,
                                                                "sshbarrier": True}
    assert normalized({"jobssh": True, "sshbarrier": False}) == {"jobssh": True}
    with pytest.raises(InvalidSshRequest, match="sshbarrier"):
        normalized({"jobssh": True, "sshbarrier": "yes"})


# ---------------------------------------------------------------- the runner


def spec_of(config: dict[str, Any]) -> JobSpec:
    return JobSpec.from_config(convert_v2(config, username="alice", storage_roots=["/nfs"],
                                          hdfs_webhdfs_url=WEBHDFS).config)


def test_the_runner_is_valid_shell_and_names_its_steps(tmp_path: Path) -> None:
    runner = runner_for(spec_of(V2), "worker", ["/nfs"], "n1", hdfs_webhdfs_url=WEBHDFS)
    assert runner is not None
    assert runner.command == f"exec /bin/sh {RUNNER}"
    assert runner.files[COMMANDS].startswith("git clone https://git.example/benchmarks")
    script = runner.files[RUNNER]
    (tmp_path / "run.sh").write_text(script)
    assert subprocess.run(["sh", "-n", str(tmp_path / "run.sh")]).returncode == 0
    assert "get https://data.example/cifar-10.tar.gz /pai/data/cifar10/cifar-10.tar.gz" \
        in script
    assert f'put "/pai/output/model/$f" {WEBHDFS}/webhdfs/v1/core/model/"$(encode "$f")"' \
           "'?op=CREATE&overwrite=true&user.name='\"$PAI_USER_NAME\"" in script
    assert runner.label.splitlines() == [
        "data prerequisite cifar10: fetching its uri",
        "script prerequisite tools: its taskStarts commands",
        "output prerequisite model: uploading its folder"]


def test_a_role_without_prerequisites_or_barrier_gets_no_runner() -> None:
    plain = {**V2, "prerequisites": V2["prerequisites"][:1],
             "taskRoles": {"worker": {"dockerImage": "img", "commands": ["true"],
                                      "resourcePerInstance": {"cpu": 1, "memoryMB": 256}}}}
    assert runner_for(spec_of(plain), "worker", ["/nfs"], "n1") is None


class _StandIn(http.server.BaseHTTPRequestHandler):
    """WebHDFS as a name node answers the runner: CREATE without data=true is
    a 307 to the same URL with it, then the bytes are kept; GETFILESTATUS,
    LISTSTATUS and OPEN over a small tree. Each call must name the user."""

    received: dict[str, bytes] = {}
    tree: dict[str, bytes | None] = {  # None: a folder
        "/code": None, "/code/train.py": b"print(1)\n", "/code/lib": None,
        "/code/lib/util.py": b"X = 1\n", "/code/lib/a b.txt": b"spaced\n"}

    def _send(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        path = unquote(url.path.removeprefix("/webhdfs/v1"))
        if query.get("user.name") != "alice" or path not in self.tree:
            self._send(404, b'{"RemoteException": {}}')
            return
        kind = "DIRECTORY" if self.tree[path] is None else "FILE"
        if query["op"] == "GETFILESTATUS":
            self._send(200, json.dumps({"FileStatus": {"type": kind}}).encode())
        elif query["op"] == "LISTSTATUS":
            children = [{"pathSuffix": p.rsplit("/", 1)[1],
                         "type": "DIRECTORY" if self.tree[p] is None else "FILE"}
                        for p in self.tree if p.rsplit("/", 1)[0] == path]
            self._send(200, json.dumps({"FileStatuses": {"FileStatus": children}}).encode())
        else:
            self._send(200, self.tree[path] or b"", "application/octet-stream")

    def do_PUT(self) -> None:
        if "data=true" not in self.path:
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}"
                                         f"{self.path}&data=true")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        length = int(self.headers.get("Content-Length") or 0)
        self.received[self.path.split("?")[0]] = self.rfile.read(length)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.mark.parametrize("tool", ["curl", "python3"])
def test_the_runners_upload_follows_the_307_with_the_bytes(stand_in: str, tmp_path: Path,
                                                           tool: str) -> None:
    found = sys.executable if tool == "python3" else shutil.which(tool)
    if found is None:
        pytest.fail(f"{tool} is not on this machine")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / tool).symlink_to(found)  # the only one of curl, wget, python3 the runner finds
    (tmp_path / "f.bin").write_bytes(b"model weights")
    url = f"{stand_in}/webhdfs/v1/out/f.bin?op=CREATE&overwrite=true&user.name=alice"
    done = subprocess.run(["/bin/sh", "-c", f"{_HELPERS}\nput \"$1\" \"$2\"", "sh",
                           str(tmp_path / "f.bin"), url],
                          env={**os.environ, "PATH": str(tools)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _StandIn.received["/webhdfs/v1/out/f.bin"] == b"model weights"


def test_the_example_runs_every_kind_and_names_paths_with_pai_variables() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "v2-prerequisites.yaml"
    converted = convert_v2(yaml.safe_load(example.read_text()), username="alice",
                           storage_roots=["/nfs"])
    role = converted.config["taskRoles"][0]
    assert [(p["type"], p["uris"]) for p in role["prerequisites"]] == [
        ("data", ["/nfs/alice/datasets/mnist"]),
        ("output", ["/nfs/alice/v2-prerequisites/model"]), ("script", [])]
    assert "training on mnist from $PAI_DEFAULT_FS_URI" in role["command"]


def test_the_runner_fetches_an_hdfs_code_dir_whole(stand_in: str, tmp_path: Path) -> None:
    """An hdfs:// codeDir is staged into /pai/code (here a folder of the
    test's) file by file, through LISTSTATUS and OPEN, as the job's user."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    done = subprocess.run(["/bin/sh", "-c", f"{_HELPERS}\nfetch_tree \"$1\" \"$2\"", "sh",
                           f"{stand_in}/webhdfs/v1/code", str(tmp_path / "code")],
                          env={**os.environ, "PATH": str(tools), "PAI_USER_NAME": "alice"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "code" / "train.py").read_bytes() == b"print(1)\n"
    assert (tmp_path / "code" / "lib" / "util.py").read_bytes() == b"X = 1\n"
    assert (tmp_path / "code" / "lib" / "a b.txt").read_bytes() == b"spaced\n"


def test_an_hdfs_code_dir_is_staged_only_when_the_operator_named_the_endpoint() -> None:
    config = {"jobName": "j", "image": "busybox", "codeDir": "hdfs://nn:9000/alice/code",
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                             "memoryMB": 128, "command": "python train.py"}]}
    spec = JobSpec.from_config(config)
    assert runner_for(spec, "main", ["/nfs"], "n1") is None  # passed through untouched
    runner = runner_for(spec, "main", ["/nfs"], "n1", hdfs_webhdfs_url=WEBHDFS)
    assert runner is not None
    assert f"fetch_tree {WEBHDFS}/webhdfs/v1/alice/code /pai/code && cd /pai/code" \
        in runner.files[RUNNER]
    assert failed_step(FIRST_STEP_EXIT, runner.label) == \
        "codeDir: fetching it from HDFS failed"


@pytest.mark.parametrize("roles", [[None], [3], [{"name": "a", "prerequisites": "x"}]])
def test_broken_task_roles_are_named_not_crashed_on(roles: list[Any]) -> None:
    """A config whose task roles failed the schema still gets its 400."""
    with pytest.raises(InvalidJobConfig):
        validate_job_config({"jobName": "j", "image": "i", "taskRoles": roles},
                            username="alice", storage_roots=["/nfs"])
