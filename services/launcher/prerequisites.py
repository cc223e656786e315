"""The runner: a task's prerequisites and SSH barrier around its commands.

For a task role with data, output or script prerequisites
(shared/domain/prerequisites.py), or a job with OpenPAI's `sshbarrier`,
the container does not run the role's command directly. The launcher
writes three kinds of files into the created container before it starts
(Docker's archive upload, as for SSH keys): the role's command
(`/pai/runtime/commands.sh`), each prerequisite's callbacks, and the
runner (`/pai/runtime/run.sh`), a POSIX shell script that in order

1. fetches each data prerequisite's URIs into `/pai/data/<name>/` and runs
   each prerequisite's `taskStarts` commands, in the role's order;
2. waits, with a barrier, until the sshd of every task it must wait for
   answers (BARRIER_SECONDS at most);
3. runs the commands (SIGTERM and SIGINT passed on, so preemption and stop
   reach them as before);
4. when they succeeded, runs each `taskSucceeds` in the reverse order and
   uploads each output prerequisite's `/pai/output/<name>/` to its
   WebHDFS URI.

A failed step ends the task with the step's exit code (FIRST_STEP_EXIT +
its position), which the monitor turns into the step's name from the
container's `pai.prerequisites` label; its cause is in the task's log,
lines starting `[pai]`. The runner fetches and uploads with what the
image has (curl, else wget for fetching, else python3), since no file of
the platform's is mounted into a job. Paths in the storage are not copied:
they are bind mounts (data read-only, output read-write), checked on the
node as dataDir and outputDir are (services/launcher/mounts.py).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from shlex import quote

from docker import APIClient

from services.launcher.environment import env_name_part
from services.launcher.mounts import CODE_MOUNT, BindMount, TaskSetupError, checked_source
from shared.domain import prerequisites, storage
from shared.domain.models import JobSpec
from shared.domain.prerequisites import (
    BARRIER_EXIT,
    FIRST_STEP_EXIT,
    RUNTIME_DIR,
    Location,
    Plan,
    Prerequisite,
    PrerequisiteError,
    Source,
    Step,
)
from shared.domain.ssh import PORT_LABEL as SSH_PORT_LABEL

RUNNER = f"{RUNTIME_DIR}/run.sh"
COMMANDS = f"{RUNTIME_DIR}/commands.sh"
BARRIER_SECONDS = 600

_HELPERS = r'''say() { echo "[pai] $*"; }
get() {  # URL FILE: the URL's bytes into FILE, with what the image has
  if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then wget -q -O "$2" "$1"
  elif command -v python3 >/dev/null 2>&1; then python3 -c '
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=300) as answer, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(answer, out)' "$1" "$2"
  else say "the image has neither curl, wget nor python3 to fetch $1 with"; return 127; fi
}
put() {  # FILE URL: WebHDFS CREATE, its 307 followed with the bytes
  if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -X PUT -L -T "$1" "$2" >/dev/null
  elif command -v python3 >/dev/null 2>&1; then python3 -c '
import os, sys, urllib.error, urllib.request
class Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs): return None
try:
    answer = urllib.request.build_opener(Stay).open(
        urllib.request.Request(sys.argv[2], method="PUT"), timeout=60)
    where = answer.headers.get("Location") or sys.argv[2]
except urllib.error.HTTPError as error:
    if error.code != 307: raise
    where = error.headers["Location"]
with open(sys.argv[1], "rb") as body:
    urllib.request.urlopen(urllib.request.Request(where, data=body, method="PUT", headers={
        "Content-Type": "application/octet-stream",
        "Content-Length": str(os.path.getsize(sys.argv[1]))}), timeout=3600)' "$1" "$2"
  else say "the image has neither curl nor python3 to upload $1 with"; return 127; fi
}
fetch_tree() {  # WEBHDFS_URL DEST: a file or a folder, all it holds, into DEST
  command -v python3 >/dev/null 2>&1 ||
    { say "fetching a WebHDFS folder needs python3 in the image"; return 127; }
  python3 -c '
import json, os, sys, urllib.parse, urllib.request
top, user, dest = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
def call(url, op):
    query = urllib.parse.urlencode({"op": op, "user.name": user})
    return urllib.request.urlopen(f"{url}?{query}", timeout=300)
def fetch(url, to):
    with call(url, "OPEN") as answer, open(to, "wb") as out:
        while chunk := answer.read(1 << 20):
            out.write(chunk)
def walk(url, to):
    os.makedirs(to, exist_ok=True)
    for entry in json.load(call(url, "LISTSTATUS"))["FileStatuses"]["FileStatus"]:
        name = entry["pathSuffix"]
        if name in ("", ".", "..") or "/" in name:
            raise SystemExit(f"the name {name!r} in {url} is not one name")
        there = f"{url}/{urllib.parse.quote(name)}"
        if entry["type"] == "DIRECTORY":
            walk(there, os.path.join(to, name))
        elif entry["type"] == "FILE":
            fetch(there, os.path.join(to, name))
os.makedirs(dest, exist_ok=True)
status = json.load(call(top, "GETFILESTATUS"))["FileStatus"]
walk(top, dest) if status["type"] == "DIRECTORY" else fetch(top, os.path.join(
    dest, urllib.parse.unquote(top.rsplit("/", 1)[-1])))' "$1" "$PAI_USER_NAME" "$2"
}
encode() { printf '%s' "$1" | sed -e 's/%/%25/g' -e 's/ /%20/g' -e 's/#/%23/g' \
  -e 's/?/%3F/g' -e 's/&/%26/g' -e 's/+/%2B/g'; }
failed() {  # CODE IGNORE WHAT: after a step that failed
  if [ "$2" = 1 ]; then say "$3 failed; its failurePolicy is ignore: going on"; return 0; fi
  say "$3 failed"; exit "$1"
}
reachable() {  # HOST PORT
  if command -v nc >/dev/null 2>&1 && nc -h 2>&1 | grep -q -- ' -z'; then
    nc -z -w 2 "$1" "$2" >/dev/null 2>&1
  elif command -v python3 >/dev/null 2>&1; then python3 -c '
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), 2).close()' "$1" "$2" 2>/dev/null
  elif command -v bash >/dev/null 2>&1; then
    bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
  elif command -v ssh-keyscan >/dev/null 2>&1; then
    ssh-keyscan -T 2 -p "$2" "$1" 2>/dev/null | grep -q .
  else say "the image has neither nc, python3, bash nor ssh-keyscan to test a port"; return 2; fi
}
'''

_COMMANDS = '''/bin/sh {commands} &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
trap 'kill -INT "$child" 2>/dev/null' INT
while :; do
  wait "$child"; code=$?
  kill -0 "$child" 2>/dev/null || break
done
trap - TERM INT
if [ "$code" -ge {first} ] && [ "$code" -le {last} ]; then
  say "the commands exited $code, a code pai keeps for its own steps: the task exits 1"
  code=1
fi
[ "$code" -eq 0 ] || exit "$code"
'''


@dataclass(frozen=True)
class Runner:
    """What a task's container gets for its runner: its files (written before
    it starts), its mounts, its command, and the label naming its steps."""

    files: dict[str, str]
    mounts: tuple[BindMount, ...]
    command: str
    label: str


def runner_for(spec: JobSpec, role: str, roots: Sequence[str], node: str, *,
               hdfs_webhdfs_url: str = "", reserved: Sequence[str] = ()) -> Runner | None:
    """The runner of `role`'s tasks; None when the role needs none.
    TaskSetupError for what the user can fix (a storage path gone, a URI
    this node cannot use)."""
    items = spec.role(role).prerequisites
    barrier = spec.ssh_barrier_roles
    code = _staged_code(spec, hdfs_webhdfs_url)
    if not items and barrier is None and code is None:
        return None
    try:
        plan = prerequisites.plan(items, roots, hdfs_webhdfs_url)
    except PrerequisiteError as error:
        raise TaskSetupError(f"prerequisites: {error}") from None
    if code is not None and len(plan.steps) >= prerequisites.MAX_STEPS:
        raise TaskSetupError(f"prerequisites: with an hdfs:// codeDir to fetch, a task role "
                             f"runs at most {prerequisites.MAX_STEPS - 1} steps")
    mounts = _mounts(plan, items, roots, node, reserved)
    files = {COMMANDS: spec.role(role).command,
             **{_callback(i, when): "\n".join(commands) + "\n" for i in items
                for when, commands in (("start", i.on_start), ("success", i.on_success))
                if commands}}
    files[RUNNER] = runner_script(plan, items, _barrier_hosts(spec, barrier), code)
    steps = ([prerequisites.CODE_STEP] if code else []) + \
        [step.describe() for step in plan.steps]
    return Runner(files, mounts, f"exec /bin/sh {RUNNER}", "\n".join(steps))


def _staged_code(spec: JobSpec, hdfs_webhdfs_url: str) -> Location | None:
    """An `hdfs://` codeDir, fetched into /pai/code before anything else when
    the operator named the cluster's WebHDFS endpoint (else it is only in
    the environment, as before)."""
    if not hdfs_webhdfs_url or not spec.code_dir.startswith(storage.HDFS_PREFIX):
        return None
    try:
        return prerequisites.locate(spec.code_dir, (), hdfs_webhdfs_url)
    except PrerequisiteError as error:
        raise TaskSetupError(f"codeDir: {error}") from None


def _callback(item: Prerequisite, when: str) -> str:
    return f"{RUNTIME_DIR}/{item.kind}-{item.name}.{when}.sh"


def _mounts(plan: Plan, items: Sequence[Prerequisite], roots: Sequence[str], node: str,
            reserved: Sequence[str]) -> tuple[BindMount, ...]:
    """Storage paths as bind mounts: data read-only at `/pai/data/<name>/<last
    name>`, output read-write at `/pai/output/<name>` (made as outputDir is)."""
    found: list[BindMount] = []
    for item in items:
        for where in plan.locations.get(item.name, ()):
            if where.source != Source.STORAGE:
                continue
            path = storage.resolve(where.path, roots)
            assert path is not None  # `plan` located it in a root
            if item.kind == "output":
                source = checked_source("outputDir", path, node, create=True,
                                        reserved=reserved)
                found.append(BindMount(source, prerequisites.folder_of(item), False))
            else:
                source = checked_source("dataDir", path, node, create=False,
                                        reserved=reserved)
                target = posixpath.join(prerequisites.folder_of(item), where.basename)
                found.append(BindMount(source, target, True))
    return tuple(found)


def _barrier_hosts(spec: JobSpec, roles: Sequence[str] | None) -> list[tuple[str, str]] | None:
    """The environment variables holding each waited-for task's IP and ssh port."""
    if roles is None:
        return None
    label = env_name_part(SSH_PORT_LABEL)
    return [(f"PAI_HOST_IP_{env_name_part(r)}_{i}",
             f"PAI_PORT_LIST_{env_name_part(r)}_{i}_{label}")
            for r in roles for i in range(spec.role(r).task_number)]


def runner_script(plan: Plan, items: Sequence[Prerequisite],
                  barrier: list[tuple[str, str]] | None, code: Location | None = None) -> str:
    """The runner's shell text (see the module's notes); with `code`, the
    codeDir staged first into /pai/code, the working directory from then on."""
    first = FIRST_STEP_EXIT + (1 if code else 0)
    codes = {step: first + n for n, step in enumerate(plan.steps)}
    lines = ["# pai's runner: this task's prerequisites around its commands.", _HELPERS]
    if code is not None:
        what = quote(prerequisites.CODE_STEP)
        lines.append(f"say {what}\nfetch_tree {quote(code.url)} {CODE_MOUNT} && "
                     f"cd {CODE_MOUNT} || failed {FIRST_STEP_EXIT} 0 {what}\n")
    for step in plan.before:
        lines.append(_step(step, codes[step], plan))
    lines += [f"mkdir -p {quote(prerequisites.folder_of(i))} || exit 1" for i in items
              if i.kind == "output" and not _mounted(plan, i)]
    if barrier is not None:
        lines.append(_barrier(barrier))
    lines.append(_COMMANDS.format(commands=COMMANDS, first=FIRST_STEP_EXIT, last=BARRIER_EXIT))
    for step in plan.after:
        lines.append(_step(step, codes[step], plan))
    lines.append("exit 0\n")
    return "\n".join(lines)


def _mounted(plan: Plan, item: Prerequisite) -> bool:
    return any(loc.source == Source.STORAGE for loc in plan.locations.get(item.name, ()))


def _step(step: Step, code: int, plan: Plan) -> str:
    item = step.prerequisite
    fail = f"failed {code} {int(item.ignore_failure)} {quote(step.describe())}"
    if step.phase in ("start", "success"):
        script = _callback(item, step.phase)
        return f"say {quote('running ' + step.describe())}\n/bin/sh -e {script} || {fail}\n"
    if step.phase == "fetch":
        folder = prerequisites.folder_of(item)
        gets = [f"get {_url(loc, 'OPEN')} {quote(posixpath.join(folder, loc.basename))}"
                for loc in plan.locations[item.name] if loc.source != Source.STORAGE]
        body = " &&\n  ".join([f"mkdir -p {quote(folder)}", *gets])
        return f"say {quote(step.describe())}\n{{ {body}; }} || {fail}\n"
    folder = prerequisites.folder_of(item)
    target = next(loc for loc in plan.locations[item.name] if loc.source == Source.WEBHDFS)
    upload = (f'( cd {quote(folder)} && find . -type f ) | while IFS= read -r f; do\n'
              f'  f="${{f#./}}"\n'
              f'  put "{folder}/$f" {quote(target.url.rstrip("/") + "/")}"$(encode "$f")"'
              f'{_query("CREATE", overwrite=True)} || exit 1\n'
              f'done')
    return f"say {quote(step.describe())}\n{{ {upload}; }} || {fail}\n"


def _query(op: str, overwrite: bool = False) -> str:
    extra = "&overwrite=true" if overwrite else ""
    return f"'?op={op}{extra}&user.name='\"$PAI_USER_NAME\""


def _url(location: Location, op: str) -> str:
    if location.source == Source.WEBHDFS:
        return f"{quote(location.url)}{_query(op)}"
    return quote(location.url)


def _barrier(hosts: list[tuple[str, str]]) -> str:
    pairs = " ".join(f'"${{{ip}}}:${{{port}}}"' for ip, port in hosts)
    return f'''say "SSH barrier: waiting for the sshd of {len(hosts)} task(s)"
deadline=$(( $(date +%s) + {BARRIER_SECONDS} ))
for peer in {pairs}; do
  until reachable "${{peer%:*}}" "${{peer##*:}}"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "SSH barrier: $peer did not answer within {BARRIER_SECONDS} s"; exit {BARRIER_EXIT}
    fi
    sleep 1
  done
done
say "SSH barrier: every task's sshd answers"
'''


def files_archive(files: Mapping[str, str], mtime: float | None = None) -> bytes:
    """A tar of the runner's files (0755, root's), for Docker's archive
    upload at `/` into the created container."""
    stamp = int(time.time() if mtime is None else mtime)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        folder = tarfile.TarInfo(RUNTIME_DIR.lstrip("/"))
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, stamp
        tar.addfile(folder)
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o755, stamp
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def install_runner(api: APIClient, container_id: str, runner: Runner) -> None:
    """Write the runner's files into the created container (before it
    starts: the job's code has not run, so nothing of its can redirect
    them). Docker's errors propagate: a task without its runner does not start."""
    api.put_archive(container_id, "/", files_archive(runner.files))
