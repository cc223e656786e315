"""The portal's storage browser in a real browser (Debian's Chromium under
Playwright) against the running platform: browse your folder, make a
folder, upload by the file picker (a file larger than an upload part, so
it goes in parts) and by drag and drop, download, delete; a share is
read-only and another user's folder out of reach; the job page links its
outputDir. What lands is read from the storage root itself."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from bench.live_platform import USER, Platform
from services.portal.files import PART_BYTES
from tests.e2e.portal_browser import shot

UPLOAD_SECONDS = 120_000  # ms, on a loaded CI machine
JOB_SECONDS = 120_000


@pytest.fixture
def folder(platform: Platform, unique: Callable[[str], str]) -> Path:
    """A fresh folder of the user's, made through the portal's form."""
    return platform.storage / USER / unique("portal-files")


def make_folder(page: Page, platform: Platform, folder: Path) -> None:
    page.goto("/storage")
    expect(page.locator("#where")).to_have_text(str(platform.storage / USER))
    page.get_by_label("New folder").fill(folder.name)
    page.get_by_role("button", name="Make folder").click()
    expect(page.locator(".flashes")).to_contain_text(f"Made folder {folder.name}.")
    page.locator("#files a.folder", has_text=folder.name).click()
    expect(page.locator("#where")).to_have_text(str(folder))
    # The text shows before the deferred script has bound the upload handlers:
    # a drop or a file chosen before "load" would reach no listener.
    page.wait_for_load_state("load")


def test_upload_in_parts_download_and_delete(page: Page, platform: Platform, folder: Path,
                                             tmp_path: Path) -> None:
    make_folder(page, platform, folder)
    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(2 * PART_BYTES + 12345))  # three parts
    page.set_input_files("#upload-files", str(big))
    expect(page.locator("#files a.file", has_text="weights.bin")).to_be_visible(
        timeout=UPLOAD_SECONDS)
    assert (folder / "weights.bin").read_bytes() == big.read_bytes()
    shot(page, "storage-uploaded")

    with page.expect_download() as downloading:
        page.locator("#files a.file", has_text="weights.bin").click()
    saved = tmp_path / "downloaded.bin"
    downloading.value.save_as(saved)
    assert saved.read_bytes() == big.read_bytes()

    page.get_by_role("button", name="Delete weights.bin").click()
    expect(page.locator(".flashes")).to_contain_text("Deleted weights.bin.")
    expect(page.locator("#files a.file", has_text="weights.bin")).to_have_count(0)
    assert not (folder / "weights.bin").exists()


def test_drag_and_drop_uploads(page: Page, platform: Platform, folder: Path) -> None:
    make_folder(page, platform, folder)
    dropped = page.evaluate_handle("""() => {
        const transfer = new DataTransfer();
        transfer.items.add(new File(["dropped here\\n"], "notes.txt"));
        return transfer;
    }""")
    page.dispatch_event("#drop", "drop", {"dataTransfer": dropped})
    expect(page.locator("#files a.file", has_text="notes.txt")).to_be_visible(
        timeout=UPLOAD_SECONDS)
    assert (folder / "notes.txt").read_text() == "dropped here\n"


def test_a_share_is_read_only_and_another_users_folder_out_of_reach(
        page: Page, platform: Platform, unique: Callable[[str], str]) -> None:
    shared = platform.storage / unique("portal-share")
    shared.mkdir()
    (shared / "train.csv").write_text("1,2\n")
    name = shared.name.lower()
    made = platform.admin.put(f"{platform.url}/api/v1/storage/shares/{name}", timeout=30,
                              json={"path": str(shared), "users": [USER]})
    assert made.status_code == 201, made.text
    page.goto("/storage")
    page.get_by_role("link", name=f"share {name}").click()
    expect(page.locator("#files a.file", has_text="train.csv")).to_be_visible()
    expect(page.locator("#drop")).to_have_count(0)
    expect(page.locator("form.delete")).to_have_count(0)
    shot(page, "storage-share")

    other = platform.storage / unique("someone")
    (other / "private").mkdir(parents=True)
    page.goto(f"/storage?path={other}")
    expect(page.locator("#storage-error")).to_contain_text("Permission denied")
    expect(page.locator("#files")).not_to_contain_text("private")


def test_the_job_page_links_its_output_folder(page: Page, platform: Platform,
                                              unique: Callable[[str], str]) -> None:
    name = unique("portal-output")
    platform.submit_accepted({"jobName": name, "image": "pai-test/busybox:latest",
                              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                                             "memoryMB": 128, "command":
                                             "echo result > $PAI_OUTPUT_DIR/result.txt"}]})
    page.goto(f"/jobs/{USER}/{name}")
    expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=JOB_SECONDS)
    output = platform.storage / USER / name / "output"
    expect(page.locator("#output-dir")).to_have_text(str(output))
    page.locator("#output-dir").click()
    expect(page).to_have_url(re.compile(r"/storage\?path="))
    expect(page.locator("#files a.file", has_text="result.txt")).to_be_visible()
