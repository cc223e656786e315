"""Storage transfers through WebHDFS against `cp` on the same disk, and the
API worker's memory while a large file goes through it.

`pai-api` runs as deployed (gunicorn, gevent workers, bench/live_platform.py)
on a throwaway Redis with a storage root in the benchmark's temporary folder.
A file of SIZE_MB (2 GiB by default; PAI_BENCH_TRANSFER_MB) is made there,
then, each timed on its own:

- the reference, `cp` of the file into the user's folder and back out, on
  the same disk;
- an upload through pai: WebHDFS CREATE, the body streamed from the file by
  one requests client (with its Content-Length), and a download: OPEN,
  streamed to a file in 1 MiB chunks (a Python client, as `pai fs` is);
- the same two with `curl` as the client (`-T` and `-o`), whose own cost is
  smaller, so what is left is closer to the API's.

Meanwhile a thread samples the resident memory (VmRSS) of every api
process (the gunicorn master and its workers) every SAMPLE_SECONDS; the
figures are each worker's largest sample before, during the upload and
during the download. The file's pages stay in the page cache between steps
for `cp` and pai alike: the figures compare the two paths through the
kernel and the API, not the disk.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from bench import BenchError, Figure, Figures, throwaway_redis
from bench.live_platform import USER, Platform, running_platform

SIZE_MB = 2048
SAMPLE_SECONDS = 0.1
BLOCK = 16 * 1024 * 1024
CHUNK = 1024 * 1024


def _make_file(path: Path, megabytes: int) -> None:
    block = os.urandom(BLOCK)
    with open(path, "wb") as out:
        left = megabytes * 1024 * 1024
        while left > 0:
            out.write(block[:min(left, BLOCK)])
            left -= BLOCK
        out.flush()
        os.fsync(out.fileno())


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class MemorySampler:
    """The largest RSS of each api worker, sampled in a thread."""

    def __init__(self, workers: list[int]) -> None:
        self.workers, self.peak = workers, dict.fromkeys(workers, 0.0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.is_set():
            for pid in self.workers:
                self.peak[pid] = max(self.peak[pid], _rss_mb(pid))
            self.stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> MemorySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def largest(self) -> float:
        return max(self.peak.values())


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _upload(pai: Platform, source: Path, target: str) -> None:
    url = f"{pai.url}/webhdfs/v1{target}"
    first = pai.http.put(url, params={"op": "CREATE", "overwrite": "true"},
                         allow_redirects=False, timeout=30)
    if first.status_code != 307:
        raise BenchError(f"CREATE answered {first.status_code}: {first.text}")
    with open(source, "rb") as body:
        done = pai.http.put(first.headers["Location"], data=body, timeout=600)
    if done.status_code != 201:
        raise BenchError(f"the upload answered {done.status_code}: {done.text}")


def _download(pai: Platform, source: str, target: Path) -> None:
    with pai.http.get(f"{pai.url}/webhdfs/v1{source}", params={"op": "OPEN"}, stream=True,
                      timeout=600) as answer, open(target, "wb") as out:
        if answer.status_code != 200:
            raise BenchError(f"OPEN answered {answer.status_code}: {answer.text}")
        for chunk in answer.iter_content(CHUNK):
            out.write(chunk)


def _curl_upload(pai: Platform, source: Path, target: str) -> None:
    token = str(pai.http.headers["Authorization"])
    subprocess.run(["curl", "-sSf", "-o", "/dev/null", "-H", f"Authorization: {token}",
                    "-T", str(source),
                    f"{pai.url}/webhdfs/v1{target}?op=CREATE&overwrite=true&data=true"],
                   check=True)


def _curl_download(pai: Platform, source: str, target: Path) -> None:
    token = str(pai.http.headers["Authorization"])
    subprocess.run(["curl", "-sSf", "-o", str(target), "-H", f"Authorization: {token}",
                    f"{pai.url}/webhdfs/v1{source}?op=OPEN"], check=True)


def run() -> Figures:
    megabytes = int(os.environ.get("PAI_BENCH_TRANSFER_MB", SIZE_MB))
    figures: dict[str, Figure] = {"file MB": megabytes}
    with throwaway_redis() as url, running_platform(url, services=("api",)) as pai:
        home = pai.storage / USER
        home.mkdir()
        source = pai.storage.parent / "source.bin"
        _make_file(source, megabytes)
        workers = _children(pai.processes.pid("api"))
        if not workers:
            raise BenchError("no api worker process found")
        requests.get(f"{pai.url}/healthz", timeout=10)
        figures["api workers"] = len(workers)
        figures["worker RSS before, MB"] = round(max(_rss_mb(p) for p in workers), 1)

        cp_in = _timed(lambda: subprocess.run(["cp", str(source), str(home / "cp.bin")],
                                              check=True))
        cp_out = _timed(lambda: subprocess.run(
            ["cp", str(home / "cp.bin"), str(pai.storage.parent / "cp-back.bin")], check=True))
        with MemorySampler(workers) as up:
            upload = _timed(lambda: _upload(pai, source, str(home / "pai.bin")))
        back = pai.storage.parent / "pai-back.bin"
        with MemorySampler(workers) as down:
            download = _timed(lambda: _download(pai, str(home / "pai.bin"), back))
        if not (filecmp.cmp(source, home / "pai.bin", shallow=False)
                and filecmp.cmp(source, back, shallow=False)):
            raise BenchError("a transferred file differs from its source")
        back.unlink()
        with MemorySampler(workers) as curl_up:
            curl_upload = _timed(lambda: _curl_upload(pai, source, str(home / "curl.bin")))
        with MemorySampler(workers) as curl_down:
            curl_download = _timed(lambda: _curl_download(pai, str(home / "curl.bin"), back))
        if not filecmp.cmp(source, back, shallow=False):
            raise BenchError("a file downloaded with curl differs from its source")

        figures.update({
            "cp in, MB/s": round(megabytes / cp_in, 1),
            "pai upload (WebHDFS CREATE), MB/s": round(megabytes / upload, 1),
            "upload / cp": round(cp_in / upload, 3),
            "cp out, MB/s": round(megabytes / cp_out, 1),
            "pai download (WebHDFS OPEN), MB/s": round(megabytes / download, 1),
            "download / cp": round(cp_out / download, 3),
            "worker RSS peak during the upload, MB": round(up.largest(), 1),
            "worker RSS peak during the download, MB": round(down.largest(), 1),
            "curl upload, MB/s": round(megabytes / curl_upload, 1),
            "curl upload / cp": round(cp_in / curl_upload, 3),
            "curl download, MB/s": round(megabytes / curl_download, 1),
            "curl download / cp": round(cp_out / curl_download, 3),
            "worker RSS peak, curl transfers, MB": round(max(curl_up.largest(),
                                                             curl_down.largest()), 1),
        })
        shutil.rmtree(home)
    return figures
