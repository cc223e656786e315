"""The portal through Flask's test client on a real Redis: its session, its
CSRF check, and that it shows and does only what the API allows the user."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re

import pytest
import redis
import yaml
from flask.testing import FlaskClient

from services.api.app import create_app
from services.portal import pages
from shared.domain import jobsort
from shared.domain.models import Gpu, Node, TaskPlacement, attempt_task_key
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.state import keys, tasksamples
from shared.state.lifecycle import mark_task_running
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.api import AuthedClient, config, csrf_of, portal_login
from tests.support.polling import wait_past


@pytest.fixture
def browser(settings: Settings, alice: AuthedClient, bob: AuthedClient) -> FlaskClient:
    """A second client of the same app (its own cookie jar): the browser."""
    return alice.client.application.test_client()


def test_a_page_sends_a_logged_out_visitor_to_the_login(browser: FlaskClient) -> None:
    for page in ("/", "/jobs", "/submit", "/nodes", "/virtual-clusters", "/jobs/alice/x"):
        resp = browser.get(page)
        assert resp.status_code == 302, page
        assert resp.headers["Location"].startswith("/login?next=")
    log = browser.get("/jobs/alice/x/tasks/main/0/log")
    assert log.status_code == 401  # an EventSource gets the API's error, not a page


def test_the_session_cookie_is_httponly_and_samesite(browser: FlaskClient) -> None:
    token = csrf_of(browser.get("/login").get_data(as_text=True))
    resp = browser.post("/login", data={"csrf_token": token, "username": "alice",
                                        "password": "secret-pw"})
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("pai_portal=")
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie  # plain http unless the operator says https
    assert "eyJ" not in resp.get_data(as_text=True)  # no token in the page


def test_behind_https_the_cookie_is_secure(settings: Settings, alice: AuthedClient) -> None:
    client = create_app(dataclasses.replace(settings, portal_secure_cookie=True)).test_client()
    token = csrf_of(client.get("/login").get_data(as_text=True))
    resp = client.post("/login", data={"csrf_token": token, "username": "alice",
                                       "password": "secret-pw"})
    assert resp.status_code == 302
    assert "Secure" in resp.headers["Set-Cookie"]


def test_a_post_without_the_csrf_token_is_refused(browser: FlaskClient,
                                                  alice: AuthedClient) -> None:
    assert browser.post("/login", data={"username": "alice",
                                        "password": "secret-pw"}).status_code == 400
    real = portal_login(browser, "alice")
    alice.post("/api/v1/user/alice/jobs", json=config("keep"))
    for sent in ({}, {"csrf_token": "forged"}, {"csrf_token": real[:-1]}):
        resp = browser.post("/jobs/alice/keep/stop", data=sent)
        assert resp.status_code == 400, sent
        resp = browser.post("/jobs/stop", data={**sent, "job": "alice/keep"})
        assert resp.status_code == 400, sent
    assert alice.get("/api/v1/user/alice/jobs/keep").json["jobStatus"]["state"] == "WAITING"
    assert browser.post("/logout", data={}).status_code == 400


def test_a_wrong_password_shows_the_apis_answer_and_counts_as_its_failures(
        settings: Settings, alice: AuthedClient) -> None:
    limited = dataclasses.replace(settings, login_failures_per_user=2)
    client = create_app(limited).test_client()
    answers = []
    for _ in range(3):
        token = csrf_of(client.get("/login").get_data(as_text=True))
        resp = client.post("/login", data={"csrf_token": token, "username": "alice",
                                           "password": "wrong"})
        answers.append((resp.status_code, resp.get_data(as_text=True)))
    assert [status for status, _ in answers] == [401, 401, 429]
    assert "the user name or the password is incorrect" in answers[0][1]
    assert "too many failed logins" in answers[2][1]
    # the REST API refuses the same user now: one throttle, not two
    api = client.post("/api/v1/token", json={"username": "alice", "password": "secret-pw"})
    assert api.status_code == 429


def test_logout_revokes_the_token_so_a_copied_cookie_is_dead(browser: FlaskClient) -> None:
    csrf = portal_login(browser, "alice")
    cookie = browser.get_cookie("pai_portal")
    assert cookie is not None
    stolen = browser.application.test_client()
    stolen.set_cookie("pai_portal", cookie.value)
    assert stolen.get("/jobs").status_code == 200
    assert browser.post("/logout", data={"csrf_token": csrf}).status_code == 302
    assert stolen.get("/jobs").status_code == 302  # to the login: the token is revoked


def test_a_user_sees_another_users_job_only_as_the_api_allows(
        browser: FlaskClient, alice: AuthedClient) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("private"))
    csrf = portal_login(browser, "bob")

    page = browser.get("/jobs/alice/private").get_data(as_text=True)
    assert "WAITING" in page  # the detail: the API shows it to every user
    assert "only alice or an admin may read the config for this job" in page
    assert 'id="stop"' not in page and 'id="log-viewer"' not in page
    assert '"command"' not in page  # the config is not in the page

    log = browser.get("/jobs/alice/private/tasks/main/0/log")
    assert log.status_code == 403
    clone = browser.get("/submit?clone=alice/private", follow_redirects=True)
    assert "cannot clone alice/private" in clone.get_data(as_text=True)
    assert '"command": "echo hi"' not in clone.get_data(as_text=True)

    stop = browser.post("/jobs/alice/private/stop", data={"csrf_token": csrf},
                        follow_redirects=True)
    assert "only alice or an admin may stop for this job" in stop.get_data(as_text=True)
    batch = browser.post("/jobs/stop", data={"csrf_token": csrf, "job": ["alice/private"],
                                             "next": "/jobs"}, follow_redirects=True)
    assert "alice/private: only alice or an admin may stop" in batch.get_data(as_text=True)
    assert alice.get("/api/v1/user/alice/jobs/private").json["jobStatus"]["state"] == "WAITING"


def test_the_owner_reads_a_task_log_through_the_portal_with_the_apis_query(
        browser: FlaskClient, alice: AuthedClient) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("readable"))
    portal_login(browser, "alice")
    assert browser.get("/jobs/alice/readable/tasks/main/0/log?tail=10").status_code == 200
    refused = browser.get("/jobs/alice/readable/tasks/main/0/log?tail=many")
    assert refused.status_code == 400 and "tail" in refused.get_data(as_text=True)


def test_the_owner_stops_a_job_from_the_list(browser: FlaskClient, alice: AuthedClient) -> None:
    for name in ("one", "two"):
        alice.post("/api/v1/user/alice/jobs", json=config(name))
    csrf = portal_login(browser, "alice")
    resp = browser.post("/jobs/stop", data={"csrf_token": csrf, "job": ["alice/one", "nope"],
                                            "next": "//evil.example/x"})
    assert resp.headers["Location"] == "/jobs"  # never off the site
    page = browser.get("/jobs").get_data(as_text=True)
    assert "alice/one: stop requested" in page and "nope: not a job" in page
    assert alice.get("/api/v1/user/alice/jobs/one").json["jobStatus"]["state"] != "WAITING"
    assert alice.get("/api/v1/user/alice/jobs/two").json["jobStatus"]["state"] == "WAITING"


def test_the_job_list_filters_through_the_api(browser: FlaskClient, alice: AuthedClient,
                                              bob: AuthedClient) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("alpha"))
    bob.post("/api/v1/user/bob/jobs", json=config("beta"))
    portal_login(browser, "alice")
    mine = browser.get("/jobs?username=bob").get_data(as_text=True)
    assert "/jobs/bob/beta" in mine and "/jobs/alice/alpha" not in mine
    keyword = browser.get("/jobs?keyword=alp").get_data(as_text=True)
    assert "/jobs/alice/alpha" in keyword and "/jobs/bob/beta" not in keyword
    bad = browser.get("/jobs?state=NOPE")
    assert "state: Must be one of: WAITING" in bad.get_data(as_text=True)  # the API's reason


def test_sorting_by_submit_time_covers_every_page(browser: FlaskClient,
                                                  alice: AuthedClient) -> None:
    """Oldest first on page 1 is the oldest job of all, not the oldest of
    the newest page."""
    size = pages.PAGE_SIZES[0]
    for number in range(size + 1):  # one more than a page
        assert alice.post("/api/v1/user/alice/jobs",
                          json=config(f"job-{number}")).status_code == 202
        wait_past(now_ms())  # distinct submit times: ties have no order to check
    portal_login(browser, "alice")
    oldest = browser.get(f"/jobs?sort=submitTime&order=asc&size={size}").get_data(as_text=True)
    newest = browser.get(f"/jobs?sort=submitTime&order=desc&size={size}").get_data(as_text=True)
    assert '/jobs/alice/job-0"' in oldest and f'/jobs/alice/job-{size}"' not in oldest
    assert f'/jobs/alice/job-{size}"' in newest and '/jobs/alice/job-0"' not in newest


def test_any_column_sorts_every_page_and_the_sort_survives_filters_and_paging(
        browser: FlaskClient, alice: AuthedClient, bob: AuthedClient) -> None:
    """By name, page 1 holds the first names of all, whatever their submit
    time; the links to the next page, the filter form and the other columns
    keep the sort and the filters."""
    size = pages.PAGE_SIZES[0]
    for number in reversed(range(size + 1)):  # the first name is submitted last
        assert alice.post("/api/v1/user/alice/jobs",
                          json=config(f"n{number:03d}")).status_code == 202
    assert bob.post("/api/v1/user/bob/jobs", json=config("a-bob")).status_code == 202
    portal_login(browser, "alice")
    first = browser.get(f"/jobs?username=alice&sort=name&order=asc&size={size}")
    html = first.get_data(as_text=True)
    assert '/jobs/alice/n000"' in html and f'/jobs/alice/n{size:03d}"' not in html
    assert "a-bob" not in html  # the filter holds
    assert 'aria-sort="ascending"' in html and html.count('aria-sort="ascending"') == 1
    assert "page=2" in html and "sort=name" in html and "username=alice" in html
    for field in jobsort.SORTS:  # every field the API sorts by has its heading
        assert f"sort={field}&amp;" in html or f"sort={field}\"" in html, field
    second = browser.get(f"/jobs?username=alice&sort=name&order=asc&size={size}&page=2")
    assert f'/jobs/alice/n{size:03d}"' in second.get_data(as_text=True)
    # the filter form carries the sort
    assert '<input type="hidden" name="sort" value="name">' in html
    assert '<input type="hidden" name="order" value="asc">' in html
    down = browser.get(f"/jobs?sort=name&order=desc&size={size}").get_data(as_text=True)
    assert '/jobs/alice/n020"' in down and "/jobs/bob/a-bob" not in down
    bogus = browser.get("/jobs?sort=config&order=asc")  # a bad link is the default sort
    assert bogus.status_code == 200 and 'aria-sort="ascending"' in bogus.get_data(as_text=True)


def test_submit_shows_field_errors_and_a_dry_run_submits_nothing(
        browser: FlaskClient, alice: AuthedClient) -> None:
    csrf = portal_login(browser, "alice")
    editor = browser.get("/submit").get_data(as_text=True)
    assert "hello-world" in editor  # prefilled with examples/hello-world.json

    bad = browser.post("/submit", data={"csrf_token": csrf, "action": "submit",
                                        "config": '{"jobName": "x", "image": "busybox", '
                                                  '"taskRoles": [{"name": "main", '
                                                  '"taskNumber": 0, "command": "true"}]}'})
    assert bad.status_code == 400
    shown = bad.get_data(as_text=True)
    assert re.search(r"<code>taskRoles\.0\.taskNumber</code></th><td>[^<]+", shown)

    dry = browser.post("/submit", data={"csrf_token": csrf, "action": "dryrun",
                                        "config": yaml.safe_dump(config("dry"))})
    assert dry.status_code == 200, dry.get_data(as_text=True)[-1500:]
    assert "Dry run: the config is valid" in dry.get_data(as_text=True)
    assert alice.get("/api/v1/user/alice/jobs/dry").status_code == 404

    done = browser.post("/submit", data={"csrf_token": csrf, "action": "submit",
                                         "config": json.dumps(config("real"))})
    assert done.headers["Location"] == "/jobs/alice/real"
    assert alice.get("/api/v1/user/alice/jobs/real").status_code == 200
    clone = browser.get("/submit?clone=alice/real").get_data(as_text=True)
    assert re.search(r"&#34;jobName&#34;: &#34;real-[0-9a-f]{4}&#34;", clone)


def test_a_file_upload_replaces_the_editor_text(browser: FlaskClient,
                                                alice: AuthedClient) -> None:
    csrf = portal_login(browser, "alice")
    resp = browser.post("/submit", content_type="multipart/form-data", data={
        "csrf_token": csrf, "action": "submit", "config": "not: [valid",
        "file": (io.BytesIO(yaml.safe_dump(config("fromfile")).encode()), "job.yaml")})
    assert resp.headers["Location"] == "/jobs/alice/fromfile"


def test_overview_pages_render_the_apis_views(browser: FlaskClient,
                                              alice: AuthedClient) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("waits"))
    portal_login(browser, "alice")
    home = browser.get("/").get_data(as_text=True)
    assert "My recent jobs" in home and "/jobs/alice/waits" in home
    vcs = browser.get("/virtual-clusters").get_data(as_text=True)
    assert '<th scope="row">default' in vcs
    assert browser.get("/nodes").status_code == 200


def test_what_a_user_wrote_is_text_on_every_page(browser: FlaskClient,
                                                 alice: AuthedClient) -> None:
    attack = "</pre><script>alert(1)</script>"
    submitted = alice.post("/api/v1/user/alice/jobs", json=config("marked") | {
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": f"echo '{attack}'"}]})
    assert submitted.status_code == 202, submitted.json
    portal_login(browser, "alice")
    resp = browser.get("/jobs/alice/marked")
    shown = resp.get_data(as_text=True)
    assert resp.status_code == 200 and "<script>alert" not in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
    policy = resp.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    submit = browser.get("/submit?next=x").get_data(as_text=True)
    assert "<script>alert" not in submit


def test_the_v2_example_is_offered_and_dry_runs_as_yaml(browser: FlaskClient,
                                                        alice: AuthedClient) -> None:
    csrf = portal_login(browser, "alice")
    editor = browser.get("/submit?example=v2-two-roles").get_data(as_text=True)
    text = re.search(r'<textarea id="config"[^>]*>(.*?)</textarea>', editor, re.S)
    assert text is not None and "protocolVersion: 2" in text.group(1)
    dry = browser.post("/submit", data={"csrf_token": csrf, "action": "dryrun",
                                        "config": html.unescape(text.group(1))})
    assert dry.status_code == 200, dry.get_data(as_text=True)[-800:]
    assert "Dry run: the config is valid" in dry.get_data(as_text=True)


def test_the_portal_works_under_openpais_rest_server_prefix(browser: FlaskClient,
                                                            alice: AuthedClient) -> None:
    page = browser.get("/rest-server/login").get_data(as_text=True)
    assert 'action="/rest-server/login"' in page
    resp = browser.post("/rest-server/login", data={
        "csrf_token": csrf_of(page), "username": "alice", "password": "secret-pw",
        "next": "/rest-server/jobs"})
    assert resp.headers["Location"] == "/rest-server/jobs"
    assert 'href="/rest-server/portal/static/portal.css"' in \
        browser.get("/rest-server/jobs").get_data(as_text=True)


def test_the_job_page_charts_its_samples_and_home_lists_idle_gpus(
        browser: FlaskClient, alice: AuthedClient, redis_client: redis.Redis) -> None:
    node, store = "portal-node", Store(redis_client)
    store.register_node(Node(name=node, ip="127.0.0.1", cpus=8, memory_mb=8192,
                             gpus=[Gpu(index=0), Gpu(index=1)]))
    busy = config("busy")
    busy["taskRoles"][0].update(taskNumber=1, gpuNumber=2)
    submitted = alice.post("/api/v1/user/alice/jobs", json=busy)
    assert submitted.status_code == 202, submitted.json
    job_id, start = "alice~busy", now_ms() - 3_600_000
    pipe = redis_client.pipeline()
    for n in range(3):  # as the node's monitor writes them
        tasksamples.add(pipe, job_id, 0, "main", 0, tasksamples.Sample(
            start + n * 15_000, 50.0 + n, 100 * 1024 * 1024, (0.0, 2.0 * n)), maxlen=100)
    pipe.execute()
    job = store.get_job(job_id)
    assert job is not None  # placed and started, as the scheduler and the monitor would
    assert commit_placement(store, job_id, version=job.version, attempt=0, launch_deadline_ms=0,
                            placements=[TaskPlacement("main", 0, node, "127.0.0.1", (0, 1), 1,
                                                      128, {"default": [15000]})])
    assert mark_task_running(store, job_id, 0, "main", 0, "c" * 64)
    # as the node's monitor flags it; and a stale flag of a task that is not running
    redis_client.hset(keys.idle_tasks(node), mapping={
        attempt_task_key(job_id, 0, "main", 0): str(start),
        attempt_task_key("alice~gone", 0, "main", 0): str(start)})
    portal_login(browser, "alice")

    page = browser.get("/jobs/alice/busy").get_data(as_text=True)

    for key in ("gpu", "cpu", "memory"):
        assert f'id="chart-{key}"' in page and f'<title id="chart-{key}-title">' in page
        assert f'id="chart-{key}-desc"' in page
    assert page.count("<polyline") == 3
    assert "main[0] (%)" in page and "main[0] (MiB)" in page  # the table fallback
    assert "From the monitor&#39;s samples (one every 15 s): Prometheus is not configured." \
        in page
    assert 'data-final="false"' in page and "Redrawn every 10 s" in page
    fragment = browser.get("/jobs/alice/busy/usage").get_data(as_text=True)
    assert fragment.lstrip().startswith("<section id=\"usage\"")  # what the script redraws
    assert fragment.count("<polyline") == 3 and "<html" not in fragment
    assert "100.0" in page  # 100 MiB in the memory table
    home = browser.get("/").get_data(as_text=True)
    idle = home.split('id="idle"', 1)[1].split("</section>", 1)[0]
    assert "/jobs/alice/busy" in idle and node in idle and "main[0]" in idle
    assert "0, 1" in idle and "alice/gone" not in idle
    task = alice.get("/api/v1/user/alice/jobs/busy").json["taskRoles"]["main"]["taskStatuses"][0]
    assert task["idleSince"] == start
    assert "(60 min)" in idle or "(61 min)" in idle


def test_another_user_sees_no_chart_of_a_job_whose_samples_the_api_refuses(
        browser: FlaskClient, alice: AuthedClient, redis_client: redis.Redis) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("private"))
    pipe = redis_client.pipeline()
    tasksamples.add(pipe, "alice~private", 0, "main", 0,
                    tasksamples.Sample(now_ms(), 1.0, 1, (50.0,)), maxlen=10)
    pipe.execute()
    portal_login(browser, "bob")
    page = browser.get("/jobs/alice/private").get_data(as_text=True)
    assert 'id="usage"' not in page and "<polyline" not in page
    assert browser.get("/jobs/alice/private/usage").status_code == 403
    assert browser.get("/").status_code == 200


def test_the_job_page_shows_debug_commands_never_the_key(
        browser: FlaskClient, alice: AuthedClient, bob: AuthedClient,
        redis_client: redis.Redis) -> None:
    store = Store(redis_client)
    store.register_node(Node(name="dbg-node", ip="127.0.0.1", cpus=8, memory_mb=8192))
    body = config("shell")
    body["ssh"] = True
    assert alice.post("/api/v1/user/alice/jobs", json=body).status_code == 202
    job = store.get_job("alice~shell")
    assert job is not None
    assert commit_placement(store, job.id, version=job.version, attempt=0, launch_deadline_ms=0,
                            placements=[TaskPlacement("main", index, "dbg-node", "127.0.0.1",
                                                      (), 1, 128, {"default": [15000 + index],
                                                                   "ssh": [15100 + index]})
                                        for index in range(2)])
    assert mark_task_running(store, job.id, 0, "main", 1, "c" * 64)
    private = alice.get("/api/v1/user/alice/jobs/shell/ssh").json["keyPair"]["privateKey"]
    portal_login(browser, "alice")

    page = browser.get("/jobs/alice/shell").get_data(as_text=True)

    debug = page.split('id="debug"', 1)[1].split("</section>", 1)[0]
    assert "pai exec shell main 1 -- sh" in debug and "pai ssh shell main 1" in debug
    assert "main 0" not in debug  # only running tasks
    body_of_key = "".join(private.splitlines()[1:-1])
    assert body_of_key[:40] not in page and "PRIVATE KEY" not in page
    other = alice.client.application.test_client()
    portal_login(other, "bob")
    assert 'id="debug"' not in other.get("/jobs/alice/shell").get_data(as_text=True)
