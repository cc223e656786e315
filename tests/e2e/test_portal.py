"""The web portal in a real browser (Debian's Chromium, driven by Playwright)
against the running platform: log in, submit from the editor, follow a job
to SUCCEEDED and read its log as it arrives, see a field error, stop a job,
filter the list, log out. Each page's screenshot is saved in ARTIFACTS."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import requests
from playwright.sync_api import Page, expect

from bench.live_platform import USER, USER_PASSWORD, Platform
from tests.e2e.portal_browser import shot

JOB_SECONDS = 120_000  # ms: a job's whole life on a loaded CI machine
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def editor_config(page: Page) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(page.locator("#config").input_value())
    return loaded


def submit_from_editor(page: Page, config: dict[str, object]) -> None:
    page.goto("/submit")
    page.locator("#config").fill(json.dumps(config, indent=2))
    page.locator("#submit").click()


def test_hello_world_from_the_editor_reaches_succeeded_with_its_log(
        page: Page, unique: Callable[[str], str]) -> None:
    page.goto("/submit")
    config = editor_config(page)
    assert config["jobName"] == "hello-world"  # prefilled with examples/hello-world.json
    shot(page, "submit")
    config["jobName"] = name = unique("portal-hello")
    page.locator("#config").fill(json.dumps(config, indent=2))
    page.locator("#submit").click()

    expect(page).to_have_url(re.compile(rf"/jobs/{USER}/{name}$"))
    expect(page.locator("#job-state")).to_have_text("SUCCEEDED", timeout=JOB_SECONDS)
    expect(page.locator("#log-text")).to_contain_text(f"Hello from {name}, task main[0]",
                                                      timeout=JOB_SECONDS)
    expect(page.locator("#log-source")).to_contain_text("is complete", timeout=JOB_SECONDS)
    expect(page.locator("#exit-code")).to_have_text("0")
    expect(page.locator("#config")).to_contain_text(f'"jobName": "{name}"')
    shot(page, "job-succeeded")


def test_a_running_jobs_log_arrives_live_and_the_stop_button_stops_it(
        page: Page, unique: Callable[[str], str]) -> None:
    name = unique("portal-ticks")
    submit_from_editor(page, {
        "jobName": name, "image": "pai-test/busybox:latest",
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "echo '<img src=x onerror=alert(1)>'; i=0; "
                                  "while true; do i=$((i+1)); echo tick $i; sleep 1; done"}]})
    expect(page).to_have_url(re.compile(rf"/jobs/{USER}/{name}$"))
    expect(page.locator("#job-state")).to_have_text("RUNNING", timeout=JOB_SECONDS)
    # lines printed after the page opened reach it while the job runs
    expect(page.locator("#log-text")).to_contain_text("tick 3", timeout=JOB_SECONDS)
    expect(page.locator("#job-state")).to_have_text("RUNNING")
    # a job's output is text on the page, never markup
    expect(page.locator("#log-text")).to_contain_text("<img src=x onerror=alert(1)>")
    expect(page.locator("#log-text img")).to_have_count(0)
    # the Debug section: the command that gets a shell in the running task
    page.locator("#debug-toggle").click()
    expect(page.locator(".debug-exec")).to_have_text(f"pai exec {name} main 0 -- sh")
    expect(page.locator(".debug-ssh")).to_have_count(0)  # the job did not ask for SSH
    # the use charts are drawn on the server: an image with a title, and a table
    for key in ("gpu", "cpu", "memory"):
        expect(page.locator(f"#chart-{key} svg[role=img] title")).to_have_count(1)
    # where the figures come from (this platform runs no Prometheus), and the
    # charts drawn again from the server while the job runs
    expect(page.locator("#usage-source")).to_contain_text(
        "From the monitor's samples (one every")
    expect(page.locator("#usage-source")).to_contain_text("Prometheus is not configured")
    expect(page.locator("#usage")).to_have_attribute("data-redraws", re.compile(r"^[1-9]"),
                                                     timeout=JOB_SECONDS)
    shot(page, "job-running")

    page.locator("#stop").click()
    expect(page.locator(".flashes")).to_contain_text("Stop requested.")
    expect(page.locator("#job-state")).to_have_text("STOPPED", timeout=JOB_SECONDS)
    expect(page.locator("#stop")).to_have_count(0)
    # the charts stop asking once the job ended
    expect(page.locator("#usage")).to_have_attribute("data-final", "true", timeout=JOB_SECONDS)
    shot(page, "job-stopped")


def test_an_invalid_config_shows_the_field_error(page: Page) -> None:
    page.goto("/submit")
    config = editor_config(page)
    role = config["taskRoles"][0]  # type: ignore[index]
    del role["cpuNumber"]
    role["memoryMB"] = 1
    page.locator("#config").fill(json.dumps(config))
    page.locator("#submit").click()

    errors = page.locator("#field-errors")
    expect(errors.get_by_role("row", name=re.compile(r"taskRoles\.0\.cpuNumber"))) \
        .to_contain_text("Missing data for required field.")
    expect(errors.get_by_role("row", name=re.compile(r"taskRoles\.0\.memoryMB"))) \
        .to_contain_text("greater than or equal to 100")
    assert '"memoryMB": 1' in page.locator("#config").input_value()  # the edit is kept
    shot(page, "submit-field-errors")

    page.locator("#dryrun").click()  # the same text, validated only
    expect(page.locator("#submit-error")).to_be_visible()


def test_the_job_list_filters_and_the_overview_pages_show_the_cluster(
        page: Page, platform: Platform, unique: Callable[[str], str]) -> None:
    prefix = unique("portal-filter")
    for suffix in ("a", "b"):
        config = {"jobName": f"{prefix}-{suffix}", "image": "pai-test/busybox:latest",
                  "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                                 "memoryMB": 128, "command": "true"}]}
        assert platform.submit(config).status_code == 202

    page.goto("/jobs")
    page.get_by_label("Name contains").fill(f"{prefix}-a")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#jobs tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"{prefix}-a")
    expect(page.locator("#job-count")).to_contain_text("1 job;")
    shot(page, "jobs-filtered")
    page.get_by_label("Name contains").fill(prefix)
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    page.get_by_role("link", name="Name").click()  # sort by name, ascending
    expect(page.locator("th[aria-sort=ascending]")).to_have_text("Name ▲")
    expect(rows.first).to_contain_text(f"{prefix}-a")
    page.get_by_role("link", name="Name ▲").click()
    expect(rows.first).to_contain_text(f"{prefix}-b")
    expect(page.locator("th[aria-sort=descending]")).to_have_text("Name ▼")
    # the filter holds across sorts; a heading is a link the keyboard reaches
    expect(rows).to_have_count(2)
    page.get_by_role("link", name="Submitted").focus()
    page.keyboard.press("Enter")  # newest first: b was submitted last
    expect(page.locator("th[aria-sort=descending]")).to_have_text("Submitted ▼")
    expect(rows.first).to_contain_text(f"{prefix}-b")
    page.get_by_role("link", name="Submitted ▼").click()
    expect(rows.first).to_contain_text(f"{prefix}-a")
    expect(rows).to_have_count(2)
    shot(page, "jobs-sorted")

    page.goto("/")
    expect(page.get_by_role("heading", name="My recent jobs")).to_be_visible()
    expect(page.get_by_role("heading", name="GPUs allocated but idle")).to_be_visible()
    expect(page.locator("main")).to_contain_text(f"{prefix}-b")
    shot(page, "home")
    page.goto("/nodes")
    expect(page.locator("#nodes")).to_contain_text(platform.node)
    shot(page, "nodes")
    page.goto("/virtual-clusters")
    expect(page.locator("#vcs").get_by_role("rowheader", name="default")).to_be_visible()
    shot(page, "virtual-clusters")


def test_log_out_ends_the_session(page: Page) -> None:
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    expect(page.locator(".flashes")).to_contain_text("You are logged out.")
    page.goto("/jobs")
    expect(page).to_have_url(re.compile(r"/login\?next=/jobs$"))


def test_a_post_without_the_csrf_token_is_refused(platform: Platform,
                                                  unique: Callable[[str], str]) -> None:
    http = requests.Session()
    token = CSRF.search(http.get(f"{platform.url}/login", timeout=10).text)
    assert token is not None
    login = http.post(f"{platform.url}/login", timeout=30, allow_redirects=False, data={
        "csrf_token": token.group(1), "username": USER, "password": USER_PASSWORD})
    assert login.status_code == 302
    name = unique("portal-csrf")
    config = {"jobName": name, "image": "pai-test/busybox:latest",
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                             "memoryMB": 128, "command": "true"}]}
    refused = http.post(f"{platform.url}/submit", timeout=30, allow_redirects=False,
                        data={"action": "submit", "config": json.dumps(config)})
    assert refused.status_code == 400
    assert "CSRF" in refused.text
    assert platform.http.get(f"{platform.url}/api/v1/user/{USER}/jobs/{name}",
                             timeout=10).status_code == 404
