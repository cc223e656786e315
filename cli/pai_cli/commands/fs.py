"""pai fs ls, put, get, mkdir, mv, rm: the cluster's storage, over WebHDFS.

Remote paths are the ones jobs name in dataDir / outputDir / codeDir (a
relative one is in your own folder, `<first storage root>/<you>`), and you
may do with them what your jobs may: your folder is yours, shares are
read-only. Long transfers show a progress bar on a terminal; `put --resume`
goes on with an interrupted put by appending what is missing.
"""

from __future__ import annotations

import io
import posixpath
from pathlib import Path

import click
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from pai_cli.formatting import format_time
from pai_cli.session import (
    CliError,
    Session,
    console,
    output_option,
    pass_session,
    print_json,
)
from pai_cli.transfers import (
    Action,
    Plan,
    TransferError,
    download_plan,
    plan_put,
    tail_range,
    upload_plan,
)
from pai_cli.webhdfs import OnBytes, WebHdfs


def storage(session: Session) -> WebHdfs:
    cluster = session.cluster()
    return WebHdfs(cluster.url, cluster.token)


def _bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=console(),
                    transient=True, disable=not console().is_terminal)


@click.group("fs")
def fs() -> None:
    """The cluster's storage: your folder and the folders shared with you.

    \b
    pai fs ls                       your folder (<first root>/<you>)
    pai fs put -r ./code code/mnist  a folder, into your folder
    pai fs get -r output/mnist .     results back
    pai fs put --resume big.tar data/big.tar   after an interrupted put
    """


@fs.command("ls")
@click.argument("path", required=False, default="")
@output_option()
@pass_session
def list_folder(session: Session, path: str, output: str) -> None:
    """List PATH (default: your folder)."""
    remote = storage(session)
    where = remote.absolute(path)
    entries = remote.list(where)
    if output == "json":
        print_json([e.__dict__ for e in entries])
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "TYPE", "SIZE", "MODIFIED", "MODE", "OWNER"):
        table.add_column(column, justify="right" if column == "SIZE" else "left")
    for e in entries:
        name = (e.name or posixpath.basename(where)) + ("/" if e.is_dir else "")
        table.add_row(name, e.kind.lower(), "" if e.is_dir else str(e.length),
                      format_time(e.modified_ms, seconds=False), e.permission, e.owner)
    console().print(table)


@fs.command("mkdir")
@click.argument("path")
@pass_session
def make_folder(session: Session, path: str) -> None:
    """Make the folder PATH and its missing parents."""
    remote = storage(session)
    remote.mkdirs(remote.absolute(path))


@fs.command("mv")
@click.argument("source")
@click.argument("target")
@pass_session
def move(session: Session, source: str, target: str) -> None:
    """Move SOURCE to TARGET (into it, when TARGET is a folder)."""
    remote = storage(session)
    if not remote.rename(remote.absolute(source), remote.absolute(target)):
        raise CliError(f"cannot move {source} to {target}: it is missing, TARGET's folder "
                       f"is missing, or TARGET exists")


@fs.command("rm")
@click.argument("paths", nargs=-1, required=True)
@click.option("-r", "--recursive", is_flag=True, help="Remove folders and all they hold.")
@pass_session
def remove(session: Session, paths: tuple[str, ...], recursive: bool) -> None:
    """Remove each PATH (a folder with what it holds only with -r)."""
    remote = storage(session)
    missing = [p for p in paths if not remote.delete(remote.absolute(p), recursive)]
    if missing:
        raise CliError(f"not there: {', '.join(missing)}")


@fs.command("put")
@click.argument("local", type=click.Path(exists=True, path_type=Path))
@click.argument("path", required=False, default="")
@click.option("-r", "--recursive", is_flag=True, help="Send a folder and all it holds.")
@click.option("-f", "--overwrite", is_flag=True, help="Replace files that are there.")
@click.option("--resume", is_flag=True,
              help="Go on with an interrupted put: append what each file lacks.")
@pass_session
def put(session: Session, local: Path, path: str, recursive: bool, overwrite: bool,
        resume: bool) -> None:
    """Send LOCAL to PATH (default: your folder; into PATH when it is a folder)."""
    remote = storage(session)
    target = remote.absolute(path)
    there = remote.status(target)
    if there is not None and there.is_dir:
        target = posixpath.join(target, local.resolve().name)
    try:
        plan = upload_plan(local, target, recursive=recursive)
    except TransferError as error:
        raise CliError(str(error)) from None
    send(remote, plan, overwrite=overwrite, resume=resume)


def send(remote: WebHdfs, plan: Plan, *, overwrite: bool, resume: bool) -> None:
    """Carry out an upload plan: folders first, then each file, one bar."""
    for folder in plan.folders:
        remote.mkdirs(folder)
    with _bar() as bar:
        task = bar.add_task("upload", total=plan.total)
        for step in plan.files:
            bar.update(task, description=posixpath.basename(step.remote))
            try:
                action, offset = plan_put(step.size, remote.status(step.remote),
                                          overwrite=overwrite, resume=resume)
            except TransferError as error:
                raise CliError(f"{step.remote}: {error}") from None
            bar.advance(task, offset)
            _send_file(remote, step.local, step.remote, action, offset,
                       lambda n: bar.advance(task, n))


def _send_file(remote: WebHdfs, local: Path, target: str, action: Action, offset: int,
               progress: OnBytes) -> None:
    with open(local, "rb") as source:
        if action == Action.CREATE:
            remote.create(target, source, local.stat().st_size, overwrite=True,
                          progress=progress)
        elif action in (Action.APPEND, Action.SKIP):
            _same_prefix(remote, source, target, offset)
            if action == Action.APPEND:
                source.seek(offset)
                remote.append(target, source, local.stat().st_size - offset,
                              progress=progress)


def _same_prefix(remote: WebHdfs, source: io.BufferedReader, target: str,
                 offset: int) -> None:
    """Refuse to resume when the bytes the server holds before `offset` end
    otherwise than the local file's (another file of the same name)."""
    start, length = tail_range(offset)
    held = io.BytesIO()
    remote.read(target, held, offset=start, length=length)
    source.seek(start)
    if held.getvalue() != source.read(length):
        raise CliError(f"{target}: what the cluster holds is not the start of {source.name}; "
                       f"--overwrite replaces it")


@fs.command("get")
@click.argument("path")
@click.argument("local", type=click.Path(path_type=Path), required=False, default=".")
@click.option("-r", "--recursive", is_flag=True, help="Fetch a folder and all it holds.")
@click.option("-f", "--overwrite", is_flag=True, help="Replace local files that exist.")
@pass_session
def get(session: Session, path: str, local: Path, recursive: bool, overwrite: bool) -> None:
    """Fetch PATH to LOCAL (default: here; into LOCAL when it is a folder)."""
    remote = storage(session)
    source = remote.absolute(path)
    entry = remote.status(source)
    if entry is None:
        raise CliError(f"{path}: no such file or folder on the cluster")
    if local.is_dir():
        local = local / posixpath.basename(source)
    try:
        plan = download_plan(source, local, entry, remote.list, recursive=recursive)
    except TransferError as error:
        raise CliError(str(error)) from None
    clash = [str(s.local) for s in plan.files if s.local.exists()]
    if clash and not overwrite:
        raise CliError(f"{clash[0]} exists here; -f replaces it")
    fetch(remote, plan)


def fetch(remote: WebHdfs, plan: Plan) -> None:
    for folder in plan.folders:
        Path(folder).mkdir(parents=True, exist_ok=True)
    with _bar() as bar:
        task = bar.add_task("download", total=plan.total)
        for step in plan.files:
            bar.update(task, description=step.local.name)
            with open(step.local, "wb") as sink:
                remote.read(step.remote, sink, progress=lambda n: bar.advance(task, n))



def code_dir_for(session: Session, config: dict[str, object], folder: Path) -> str:
    """Where `pai submit --upload-code FOLDER` puts the job's code:
    `<your folder>/code/<jobName>`, the job's codeDir. A protocol v2 config
    has no codeDir."""
    if "protocolVersion" in config:
        raise CliError("--upload-code sets codeDir, which protocol v2 configs do not have; "
                       "send the code with pai fs put -r and name its folder in commands")
    if not folder.is_dir():
        raise CliError(f"--upload-code {folder}: not a folder")
    return posixpath.join(storage(session).home(), "code", str(config.get("jobName", "")))


def upload_code(session: Session, folder: Path, code_dir: str) -> None:
    """FOLDER's files to `code_dir`, replacing files of the same names."""
    send(storage(session), upload_plan(folder, code_dir, recursive=True), overwrite=True,
         resume=False)
