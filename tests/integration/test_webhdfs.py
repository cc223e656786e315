"""WebHDFS over the storage roots, driven by the clients OpenPAI users point
at a cluster: HdfsCLI (its Python API and its `hdfscli` command) and
fsspec's `webhdfs` file system, each against pai served over HTTP on a real
Redis. One test per operation and client; the refusals are in
test_webhdfs_attacks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from hdfs import Client, HdfsError, InsecureClient, TokenClient

from shared.infra.config import Settings
from tests.support.webhdfs import Pai, pai_served, remote_exception

pytestmark = pytest.mark.redis


@pytest.fixture
def pai(settings: Settings, tmp_path: Path) -> Iterator[Pai]:
    with pai_served(settings, tmp_path) as served:
        yield served


@pytest.fixture
def hdfs(pai: Pai) -> TokenClient:
    """alice's HdfsCLI client, her login as WebHDFS's `delegation=`."""
    return TokenClient(pai.url, pai.token("alice"))


@pytest.fixture
def home(pai: Pai) -> Path:
    return pai.root / "alice"


@pytest.fixture
def fs(pai: Pai) -> fsspec.AbstractFileSystem:
    """alice's fsspec `webhdfs` file system (`token=` is `delegation=`)."""
    port = int(pai.url.rsplit(":", 1)[1])
    return fsspec.filesystem("webhdfs", host="127.0.0.1", port=port,
                             token=pai.token("alice"), skip_instance_cache=True)


# ---------------------------------------------------------------- HdfsCLI


def test_hdfscli_mkdirs_then_status_and_list(hdfs: TokenClient, home: Path) -> None:
    hdfs.makedirs(f"{home}/data/train", permission=750)
    assert (home / "data" / "train").is_dir()
    assert (home / "data" / "train").stat().st_mode & 0o777 == 0o750
    status = hdfs.status(f"{home}/data")
    assert (status["type"], status["owner"], status["childrenNum"]) == ("DIRECTORY", "alice", 1)
    assert hdfs.list(f"{home}/data") == ["train"]


def test_hdfscli_create_writes_the_file_in_two_steps(hdfs: TokenClient, home: Path) -> None:
    hdfs.write(f"{home}/code/train.py", data=b"print('hi')\n")
    assert (home / "code" / "train.py").read_bytes() == b"print('hi')\n"
    assert (home / "code" / "train.py").stat().st_mode & 0o777 == 0o644
    status = hdfs.status(f"{home}/code/train.py")
    assert (status["type"], status["length"]) == ("FILE", 12)


def test_hdfscli_create_refuses_an_existing_file_unless_overwrite(hdfs: TokenClient,
                                                                  home: Path) -> None:
    hdfs.write(f"{home}/a.txt", data=b"first")
    with pytest.raises(HdfsError) as refused:
        hdfs.write(f"{home}/a.txt", data=b"second")
    assert refused.value.exception == "FileAlreadyExistsException"
    assert (home / "a.txt").read_bytes() == b"first"
    hdfs.write(f"{home}/a.txt", data=b"second", overwrite=True)
    assert (home / "a.txt").read_bytes() == b"second"


def test_hdfscli_create_streams_a_generator_body(hdfs: TokenClient, home: Path) -> None:
    """A generator goes chunked (no Content-Length): every chunk lands, in order."""
    hdfs.write(f"{home}/big.bin", data=(bytes([i]) * 300_000 for i in range(10)))
    data = (home / "big.bin").read_bytes()
    assert len(data) == 3_000_000
    assert data[::300_000] == bytes(range(10))


def test_hdfscli_append(hdfs: TokenClient, home: Path) -> None:
    hdfs.write(f"{home}/log.txt", data=b"one\n")
    hdfs.write(f"{home}/log.txt", data=b"two\n", append=True)
    assert (home / "log.txt").read_bytes() == b"one\ntwo\n"


def test_hdfscli_open_with_offset_and_length(hdfs: TokenClient, home: Path) -> None:
    home.mkdir()
    (home / "digits").write_bytes(b"0123456789")
    with hdfs.read(f"{home}/digits") as whole:
        assert whole.read() == b"0123456789"
    with hdfs.read(f"{home}/digits", offset=3, length=4) as part:
        assert part.read() == b"3456"
    with hdfs.read(f"{home}/digits", offset=8) as tail:
        assert tail.read() == b"89"
    with hdfs.read(f"{home}/digits", offset=10) as end:
        assert end.read() == b""


def test_hdfscli_rename_moves_into_a_folder_and_refuses_a_taken_name(hdfs: TokenClient,
                                                                      home: Path) -> None:
    hdfs.write(f"{home}/model.pt", data=b"weights")
    hdfs.makedirs(f"{home}/runs")
    hdfs.rename(f"{home}/model.pt", f"{home}/runs")
    assert (home / "runs" / "model.pt").read_bytes() == b"weights"
    hdfs.write(f"{home}/other.pt", data=b"x")
    with pytest.raises(HdfsError, match="Unable to rename"):
        hdfs.rename(f"{home}/other.pt", f"{home}/runs/model.pt")
    assert (home / "runs" / "model.pt").read_bytes() == b"weights"


def test_hdfscli_delete(hdfs: TokenClient, home: Path) -> None:
    hdfs.write(f"{home}/out/a/b.txt", data=b"x")
    with pytest.raises(HdfsError) as refused:
        hdfs.delete(f"{home}/out")
    assert refused.value.exception == "PathIsNotEmptyDirectoryException"
    assert hdfs.delete(f"{home}/out", recursive=True) is True
    assert not (home / "out").exists()
    assert hdfs.delete(f"{home}/out") is False


def test_hdfscli_content_summary(hdfs: TokenClient, home: Path) -> None:
    hdfs.write(f"{home}/d/one", data=b"12345")
    hdfs.write(f"{home}/d/sub/two", data=b"123")
    summary = hdfs.content(f"{home}/d")
    assert (summary["directoryCount"], summary["fileCount"], summary["length"]) == (2, 2, 8)


def test_hdfscli_relative_paths_are_under_the_home_folder(pai: Pai, home: Path) -> None:
    """A relative path resolves against GETHOMEDIRECTORY: `<first root>/<user>`."""
    client = TokenClient(pai.url, pai.token("alice"))
    client.write("notes.txt", data=b"in my folder")
    assert (home / "notes.txt").read_bytes() == b"in my folder"


def test_hdfscli_upload_and_download_a_folder(hdfs: TokenClient, home: Path,
                                              tmp_path: Path) -> None:
    local = tmp_path / "local" / "dataset"
    (local / "part").mkdir(parents=True)
    (local / "a.csv").write_bytes(b"a,b\n1,2\n")
    (local / "part" / "b.csv").write_bytes(os.urandom(200_000))
    hdfs.upload(f"{home}/dataset", str(local), n_threads=2)
    assert (home / "dataset" / "part" / "b.csv").read_bytes() == \
        (local / "part" / "b.csv").read_bytes()
    back = tmp_path / "back"
    hdfs.download(f"{home}/dataset", str(back), n_threads=2)
    assert (back / "a.csv").read_bytes() == b"a,b\n1,2\n"
    assert (back / "part" / "b.csv").read_bytes() == (local / "part" / "b.csv").read_bytes()


def test_hdfscli_with_a_bearer_header_and_under_the_rest_server_prefix(pai: Pai,
                                                                       home: Path) -> None:
    """OpenPAI's clients address `<cluster>/rest-server/...`; a session may
    carry the login as a bearer header instead of `delegation=`."""
    client = Client(f"{pai.url}/rest-server", session=pai.session("alice"))
    client.write(f"{home}/via-prefix.txt", data=b"ok")
    assert client.list(str(home)) == ["via-prefix.txt"]
    with client.read(f"{home}/via-prefix.txt") as reader:
        assert reader.read() == b"ok"


def test_hdfscli_insecure_client_with_its_own_user_name_and_a_token(pai: Pai,
                                                                    home: Path) -> None:
    """`user.name` is accepted when it names the token's own login."""
    client = InsecureClient(pai.url, user="alice", session=pai.session("alice"))
    client.makedirs(f"{home}/named")
    assert client.status(f"{home}/named")["type"] == "DIRECTORY"


def test_hdfscli_command_uploads_and_downloads(pai: Pai, home: Path, tmp_path: Path) -> None:
    config = tmp_path / "hdfscli.cfg"
    config.write_text(f"[global]\ndefault.alias = pai\n\n[pai.alias]\nurl = {pai.url}\n"
                      f"client = TokenClient\ntoken = {pai.token('alice')}\n")
    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(1_500_000))
    env = {**os.environ, "HDFSCLI_CONFIG": str(config)}
    hdfscli = Path(sys.executable).parent / "hdfscli"
    upload = subprocess.run([str(hdfscli), "upload", "-s", str(source), f"{home}/w.bin"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert upload.returncode == 0, upload.stderr
    assert (home / "w.bin").read_bytes() == source.read_bytes()
    download = subprocess.run([str(hdfscli), "download", f"{home}/w.bin", "-"], env=env,
                              capture_output=True, timeout=120)
    assert download.returncode == 0, download.stderr
    assert download.stdout == source.read_bytes()


# ---------------------------------------------------------------- fsspec


def test_fsspec_mkdir_ls_info_exists(fs: fsspec.AbstractFileSystem, home: Path) -> None:
    fs.makedirs(f"{home}/a/b", exist_ok=True)
    assert fs.exists(f"{home}/a/b")
    assert not fs.exists(f"{home}/a/c")
    assert fs.ls(f"{home}/a") == [f"{home}/a/b"]
    assert fs.info(f"{home}/a/b")["type"] == "directory"
    assert fs.home_directory() == str(home)


def test_fsspec_write_read_and_ranges(fs: fsspec.AbstractFileSystem, home: Path) -> None:
    """Writing is CREATE of an empty file, then APPENDs of each block; a read
    of a range is OPEN with offset and length."""
    payload = os.urandom(12 * 1024 * 1024 + 5)  # past fsspec's 5 MiB block
    with fs.open(f"{home}/blob", "wb") as out:
        out.write(payload)
    assert (home / "blob").read_bytes() == payload
    assert fs.cat_file(f"{home}/blob") == payload
    assert fs.cat_file(f"{home}/blob", start=7_000_000, end=7_000_010) == \
        payload[7_000_000:7_000_010]
    assert fs.size(f"{home}/blob") == len(payload)


def test_fsspec_put_and_get_recursive(fs: fsspec.AbstractFileSystem, home: Path,
                                      tmp_path: Path) -> None:
    local = tmp_path / "up"
    (local / "inner").mkdir(parents=True)
    (local / "x.txt").write_text("x")
    (local / "inner" / "y.txt").write_text("y")
    fs.put(str(local), f"{home}/up", recursive=True)
    assert (home / "up" / "inner" / "y.txt").read_text() == "y"
    fs.get(f"{home}/up", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "inner" / "y.txt").read_text() == "y"
    assert (tmp_path / "down" / "x.txt").read_text() == "x"


def test_fsspec_mv_rm_and_summary(fs: fsspec.AbstractFileSystem, home: Path) -> None:
    fs.pipe_file(f"{home}/m/one", b"1234")
    fs.mv(f"{home}/m/one", f"{home}/m/two")
    assert fs.ls(f"{home}/m") == [f"{home}/m/two"]
    assert fs.content_summary(f"{home}/m")["length"] == 4
    fs.rm(f"{home}/m", recursive=True)
    assert not (home / "m").exists()


def test_fsspec_errors_are_python_errors(fs: fsspec.AbstractFileSystem, pai: Pai,
                                         home: Path) -> None:
    """FileNotFoundException and AccessControlException reach fsspec users as
    FileNotFoundError and PermissionError."""
    with pytest.raises(FileNotFoundError):
        fs.info(f"{home}/missing")
    with pytest.raises(PermissionError):
        fs.ls(str(pai.root / "bob"))


# ---------------------------------------------------------------- the protocol itself


def test_create_answers_307_back_to_pai_with_data_true(pai: Pai, home: Path) -> None:
    session = pai.session("alice")
    first = session.put(pai.webhdfs(f"{home}/f.txt"), params={"op": "CREATE"},
                        allow_redirects=False)
    assert first.status_code == 307
    location = first.headers["Location"]
    assert location.startswith(pai.webhdfs(f"{home}/f.txt")) and "data=true" in location
    assert not (home / "f.txt").exists()  # no byte travelled yet
    second = session.put(location, data=b"payload")
    assert second.status_code == 201
    assert (home / "f.txt").read_bytes() == b"payload"


def test_noredirect_gives_the_location_as_json(pai: Pai, home: Path) -> None:
    session = pai.session("alice")
    answer = session.put(pai.webhdfs(f"{home}/g.txt"),
                         params={"op": "CREATE", "noredirect": "true"})
    assert answer.status_code == 200
    assert "data=true" in answer.json()["Location"]


def test_an_upload_far_past_the_json_body_limit_is_taken(pai: Pai, home: Path) -> None:
    """The API's 1 MiB body limit is for JSON; an upload is not held to it."""
    session = pai.session("alice")
    body = os.urandom(3 * 1024 * 1024)
    answer = session.put(pai.webhdfs(f"{home}/large"),
                         params={"op": "CREATE", "data": "true"}, data=body)
    assert answer.status_code == 201, answer.text
    assert (home / "large").read_bytes() == body


def test_a_share_is_readable_by_those_it_grants(pai: Pai) -> None:
    admin = pai.session("root")
    shared = pai.root / "datasets" / "mnist"
    shared.mkdir(parents=True)
    (shared / "train.csv").write_text("1,2\n")
    made = admin.put(f"{pai.url}/api/v1/storage/shares/mnist",
                     json={"path": str(shared), "users": ["bob"]})
    assert made.status_code == 201, made.text
    bob = TokenClient(pai.url, pai.token("bob"))
    assert bob.list(str(shared)) == ["train.csv"]
    with bob.read(f"{shared}/train.csv") as reader:
        assert reader.read() == b"1,2\n"
    answer = pai.session("alice").get(pai.webhdfs(f"{shared}/train.csv"),
                                      params={"op": "OPEN"})
    assert remote_exception(answer, 403) == "AccessControlException"


def test_an_admin_reads_and_writes_any_users_folder(pai: Pai) -> None:
    admin = TokenClient(pai.url, pai.token("root"))
    admin.write(f"{pai.root}/alice/from-admin", data=b"x")
    assert (pai.root / "alice" / "from-admin").read_bytes() == b"x"
    assert "alice" in admin.list(str(pai.root))
