"""The web console in a real browser (Debian's Chromium, driven by Playwright) against a real
daemon with real workers running the README's example backends: the login and a one-time link,
the overview, a scale from the CLI showing on an open page within a second, the scale, undo,
restart and delete actions with their confirmations (and a forged change refused), a canary
release's panel with its promote and abort buttons, a backend's page, a replica's log, and a
failed backend's page (each failed start's error, traceback and kept log, gone once it is
healthy again). No page may log an error in the browser's console. A
screenshot of each page is kept in ``artifacts/console/`` (``$CONSOLE_ARTIFACTS``).

Skipped, saying why, where Chromium or Playwright is missing; ``.ci/run`` installs both and sets
``CONTROLLER_BROWSER_TESTS=required``, under which a missing browser fails instead."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..conftest import FIGURES
from ..pristine import EXAMPLES
from ..workers import worker_pids

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page

HERE = Path(__file__).parent.parent
ARTIFACTS = Path(os.environ.get("CONSOLE_ARTIFACTS", HERE.parent / "artifacts" / "console"))
#: Every wait on the real clock is bounded by this (a page action, a CLI command, a start).
LIMIT_S = 60
#: The issue's promise: a change shows on an open page within a second.
LIVE_MS = 1000


def _chromium() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _unavailable(why: str) -> None:
    if os.environ.get("CONTROLLER_BROWSER_TESTS") == "required":
        pytest.fail(f"the console's browser tests are required here, but {why}")
    pytest.skip(f"the console's browser tests need a browser: {why}")


class Daemon:
    """`controller run` on the example backends, on ports of its own, and its CLI."""

    def __init__(self) -> None:
        self.state_dir = Path(tempfile.mkdtemp(prefix="cb", dir="/tmp"))  # short: sockets
        self.log: list[str] = []
        self._listening = threading.Event()
        self.process = subprocess.Popen(
            [
                *self.argv(),
                "run",
                "--listen",
                "127.0.0.1:0",
                "--ingress-listen",
                "127.0.0.1:0",
                "--config",
                str(EXAMPLES / "backends.toml"),
                "--pythonpath",
                str(EXAMPLES),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(LIMIT_S) or self.process.poll() is not None:
            self.kill()
            raise AssertionError("the daemon did not start:\n" + "".join(self.log))
        self.url: str = json.loads((self.state_dir / "daemon.json").read_text())["url"]
        self.token = (self.state_dir / "token").read_text().strip()
        # Its example backends all serving, its fork server up, before any test begins: a
        # process it started during a test would count as that test's leftover (seen on a busy
        # CI), and killing it would have the daemon start another during the next.
        self.wait_until("serving", self._all_serving)

    def _all_serving(self) -> bool:
        listed = self.api("GET", "/api/v1/backends?view=summary")["backends"]
        return bool(listed) and all(b["ready"] == b["desired"] for b in listed)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if "listening on" in line:
                self._listening.set()
        self._listening.set()

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "controller", "--state-dir", str(self.state_dir)]

    @property
    def ingress_url(self) -> str:
        """Where its ingress serves (its log says so once bound)."""
        found = re.search(r"ingress serving routes on (http://[0-9.:]+)", "".join(self.log))
        assert found is not None, "".join(self.log)
        return found.group(1)

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [*self.argv(), *args], capture_output=True, text=True, timeout=LIMIT_S, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=LIMIT_S) as response:
            return json.loads(response.read())

    def fetch(self, path: str, headers: dict[str, str]) -> tuple[int, str]:
        """A GET with exactly these headers (no token): its status and body."""
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=LIMIT_S) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode()

    def status(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.api("GET", f"/api/v1/backends/{name}")
        return found

    def wait_until(self, what: str, done: Any) -> None:
        """Wait on the daemon's own long poll until `done()` holds."""
        deadline = time.monotonic() + LIMIT_S
        changes = self.api("GET", "/api/v1/changes")
        while not done():
            assert time.monotonic() < deadline, f"not {what} within {LIMIT_S}s"
            query = f"epoch={changes['epoch']}&since={changes['cursor']}&timeout_s=5"
            changes = self.api("GET", f"/api/v1/changes?{query}")

    def stop(self) -> None:
        try:
            self.cli("shutdown")
            self.process.wait(LIMIT_S)
        finally:
            self.kill()

    def kill(self) -> None:
        """Whatever is left, gone: the daemon and every worker it started."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(LIMIT_S)
        if self.process.stderr is not None:
            self.process.stderr.close()
        for pid in worker_pids(self.state_dir):
            os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(self.state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = _chromium()
    if executable is None:
        _unavailable("no Chromium was found (Debian: `apt-get install chromium`)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed (`pip install playwright`)")
    # trio-asyncio, once imported (by the asyncio embedding's tests), makes every new asyncio
    # loop one of its own, and Playwright's driver must run on a plain one: set the standard
    # policy for this thread while the browser runs (trio-asyncio then gets out of the way).
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    with contextlib.ExitStack() as stack:
        stack.callback(asyncio.set_event_loop_policy, None)
        playwright = stack.enter_context(sync_playwright())
        launched = playwright.chromium.launch(
            executable_path=executable,
            # The machine's network is closed: Chromium's own calls home would only fail.
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        stack.callback(launched.close)
        yield launched


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    running = Daemon()
    try:
        yield running
    finally:
        running.stop()


class Tab:
    """One page in a fresh browser context (its own cookies), which keeps what the browser's
    console said."""

    def __init__(self, browser: Browser, daemon: Daemon):
        self.daemon = daemon
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.context.set_default_timeout(LIMIT_S * 1000)
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            self.errors.append(f"{message.type}: {message.text} ({message.location})")

    def go(self, path: str) -> None:
        self.page.goto(self.daemon.url + path)

    def log_in(self) -> None:
        self.go("/")
        self.page.fill("#token", self.daemon.token)
        self.page.press("#token", "Enter")
        self.page.wait_for_url(self.daemon.url + "/")
        self.page.wait_for_selector('tr[data-backend="echo"]')

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def ready_text(self, name: str) -> str:
        return self.page.inner_text(f'tr[data-backend="{name}"] .ready')

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Browser, daemon: Daemon) -> Iterator[Tab]:
    opened = Tab(browser, daemon)
    try:
        yield opened
    finally:
        opened.close()
    assert opened.errors == [], "the browser's console logged errors"


def test_log_in_with_the_token_and_see_the_example_backends(tab: Tab) -> None:
    tab.go("/backends/echo")
    tab.page.wait_for_url(re.compile(r".*/login\?next=.*"))
    tab.shot("login")
    tab.page.fill("#token", "not the token")
    with tab.page.expect_response(lambda r: r.request.method == "POST") as answer:
        tab.page.press("#token", "Enter")
    assert answer.value.status == 401
    tab.page.wait_for_function(
        "() => document.querySelector('#login-error').textContent.includes('not the daemon')"
    )
    # Chromium reports the refused login's 401 as a failed load: it is the test's own doing.
    tab.errors = [e for e in tab.errors if "401" not in e]

    tab.page.fill("#token", tab.daemon.token)
    tab.page.press("#token", "Enter")
    tab.page.wait_for_url(tab.daemon.url + "/backends/echo")  # where it was going
    cookies = tab.context.cookies()
    assert len(cookies) == 1
    assert cookies[0]["httpOnly"]
    assert cookies[0]["sameSite"] == "Strict"
    assert tab.page.evaluate("() => document.cookie") == ""  # no script can read it
    key = tab.page.evaluate("() => localStorage.getItem('controller-console-key')")
    assert re.fullmatch(r"[0-9a-f]{32}", key)

    # The cookie alone, as another server on this host would receive it: the shell, no data.
    cookie = f"{cookies[0]['name']}={cookies[0]['value']}"
    assert tab.daemon.fetch("/api/v1/backends", {"Cookie": cookie})[0] == 401
    status, page = tab.daemon.fetch("/backends/echo", {"Cookie": cookie})
    assert status == 200
    assert key not in page
    assert tab.daemon.token not in page
    status, _ = tab.daemon.fetch("/api/v1/backends", {"Cookie": cookie, "X-Console-Key": key})
    assert status == 200

    tab.go("/")
    tab.page.wait_for_selector('tr[data-backend="greeter"]')
    names = tab.page.eval_on_selector_all(
        "#backends tr[data-backend]", "rows => rows.map(r => r.dataset.backend)"
    )
    assert names == ["echo", "greeter", "hello"]
    tab.page.wait_for_function(
        "() => document.querySelector('tr[data-backend=\"echo\"] .ready').textContent === '2/2'"
    )
    assert tab.ready_text("greeter") == "1/1"
    assert "/echo" in tab.page.inner_text('tr[data-backend="echo"]')
    # The runtime's nodes: LocalRuntime's one, this machine, holding the example's replicas.
    tab.page.wait_for_selector("#nodes tr[data-node]")
    machine = tab.page.inner_text("#nodes tr[data-node]")
    assert "echo=2" in machine
    assert "greeter=1" in machine
    tab.shot("overview")


def test_a_login_goes_on_only_to_a_page_of_this_daemon(browser: Browser, daemon: Daemon) -> None:
    for asked in ["//example.com/x", "/\\example.com", "https://example.com/", "/\t/example.com"]:
        tab = Tab(browser, daemon)
        try:
            tab.page.goto(f"{daemon.url}/login?next={urllib.parse.quote(asked)}")
            tab.page.fill("#token", daemon.token)
            tab.page.press("#token", "Enter")
            tab.page.wait_for_url(daemon.url + "/")
            tab.page.wait_for_selector('tr[data-backend="echo"]')
            assert tab.errors == []
        finally:
            tab.close()


def test_a_one_time_link_logs_in_once_and_leaves_no_code_in_the_address(
    tab: Tab, browser: Browser
) -> None:
    said = tab.daemon.cli("console", "--no-open")
    link = re.search(r"(http://\S+/login#code=\S+)", said)
    assert link is not None, said
    tab.page.goto(link.group(1))
    tab.page.wait_for_url(tab.daemon.url + "/")
    tab.page.wait_for_selector('tr[data-backend="echo"]')
    assert "code" not in tab.page.url
    history = tab.page.evaluate("history.length")
    assert history <= 2

    again = Tab(browser, tab.daemon)
    try:
        again.page.goto(link.group(1))
        again.page.wait_for_function(
            "() => document.querySelector('#login-error').textContent.includes('used or expired')"
        )
        assert again.context.cookies() == []
        # The refused exchange is the test's own doing.
        assert all("403" in e for e in again.errors), again.errors
    finally:
        again.close()


def test_a_scale_from_the_cli_shows_on_the_open_page_within_a_second(tab: Tab) -> None:
    tab.log_in()
    tab.page.wait_for_function(
        "() => document.querySelector('tr[data-backend=\"echo\"] .ready').textContent === '2/2'"
    )
    try:
        tab.daemon.cli("scale", "echo", "3")
        said = time.monotonic()
        tab.page.wait_for_function(
            "() => document.querySelector('tr[data-backend=\"echo\"] .ready')"
            ".textContent.endsWith('/3')",
            timeout=LIVE_MS,
        )
        FIGURES["console: a CLI scale shown on the open overview after"] = (
            f"{(time.monotonic() - said) * 1000:.0f} ms (promise: {LIVE_MS} ms)"
        )
        tab.page.wait_for_function(
            "() => document.querySelector('tr[data-backend=\"echo\"] .ready').textContent === '3/3'"
        )
    finally:
        tab.daemon.cli("scale", "echo", "2", "--wait")


def test_the_scale_action_asks_first_and_a_forged_change_is_refused(tab: Tab) -> None:
    tab.log_in()
    row = 'tr[data-backend="greeter"]'
    # Asked, then cancelled: nothing changes.
    tab.page.click(f"{row} button:has-text('Scale')")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    tab.shot("scale-dialog")
    tab.page.click("#confirm-cancel")
    tab.page.wait_for_selector("#confirm-dialog:not([open])", state="attached")
    assert tab.daemon.status("greeter")["desired"] == 1

    tab.page.click(f"{row} button:has-text('Scale')")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    tab.page.fill("#confirm-dialog input[type=number]", "2")
    tab.page.click("#confirm-ok")
    tab.page.wait_for_function(
        "() => document.querySelector('tr[data-backend=\"greeter\"] .ready').textContent === '2/2'"
    )
    assert tab.daemon.status("greeter")["desired"] == 2
    assert "greeter" in tab.page.inner_text("#notice")

    # What another site's page (or a script without the session's key) could send: the cookie
    # goes along, the key does not.
    forged = tab.page.evaluate(
        """async () => {
            const r = await fetch('/api/v1/backends/greeter/scale', {
                method: 'POST', headers: {'content-type': 'application/json'},
                body: JSON.stringify({replicas: 5})});
            return [r.status, (await r.json()).error.type];
        }"""
    )
    assert forged == [403, "CSRFRejected"]
    wrong = tab.page.evaluate(
        """async () => (await fetch('/api/v1/backends/greeter', {
                method: 'DELETE', headers: {'x-console-key': '0'.repeat(32)}})).status"""
    )
    assert wrong == 403
    assert tab.daemon.status("greeter")["desired"] == 2
    tab.errors = [e for e in tab.errors if "403" not in e]  # the forged calls' own failures
    tab.daemon.cli("scale", "greeter", "1", "--wait")


def test_a_backend_page_shows_replicas_events_chart_and_revisions(tab: Tab) -> None:
    tab.log_in()
    tab.page.click('tr[data-backend="echo"] a')
    tab.page.wait_for_url(tab.daemon.url + "/backends/echo")
    tab.page.wait_for_function(
        "() => document.querySelectorAll('#replicas tr[data-replica]').length === 2"
    )
    tags = {r["tag"] for r in tab.daemon.status("echo")["replicas"]}
    shown = set(
        tab.page.eval_on_selector_all(
            "#replicas tr[data-replica]", "rows => rows.map(r => r.dataset.replica)"
        )
    )
    assert shown == tags
    assert tab.page.inner_text("#ready") == "2/2"
    assert "Deploy" in tab.page.inner_text("#events")
    tab.page.wait_for_selector("#chart svg")
    assert tab.page.locator("#revisions tr").count() >= 1
    pids = {str(r["pid"]) for r in tab.daemon.status("echo")["replicas"]}
    text = tab.page.inner_text("#replicas")
    assert all(pid in text for pid in pids)
    # Requests through the ingress: the replicas' own counts show in their rows.
    for _ in range(6):
        with urllib.request.urlopen(tab.daemon.ingress_url + "/echo", timeout=LIMIT_S) as answer:
            assert answer.status == 200
    tab.page.wait_for_function(
        "() => [...document.querySelectorAll('#replicas td.served')]"
        ".reduce((sum, td) => sum + (Number(td.textContent) || 0), 0) >= 6"
    )
    tab.shot("backend")


def test_a_multiplexed_backends_page_shows_its_models_and_who_holds_them(tab: Tab) -> None:
    daemon = tab.daemon
    daemon.cli("apply", "-f", str(EXAMPLES / "multiplexing.toml"), "--wait")
    try:
        replicas = []
        for model in ("m1", "m1", "m2"):
            ask = urllib.request.Request(
                daemon.ingress_url + "/predict?text=hi", headers={"x-model-id": model}
            )
            with urllib.request.urlopen(ask, timeout=LIMIT_S) as answer:
                replicas.append(json.loads(answer.read())["replica"])
        tab.log_in()
        tab.page.goto(daemon.url + "/backends/models")
        tab.page.wait_for_function(
            "() => document.querySelector('#models tr[data-model=\"m1\"]')"
            "?.textContent.includes('2')",
            timeout=LIMIT_S * 1000,
        )
        row = tab.page.inner_text('#models tr[data-model="m1"]')
        assert replicas[0] in row
        assert replicas[2] in tab.page.inner_text('#models tr[data-model="m2"]')
        held = tab.page.inner_text(f'#replicas tr[data-replica="{replicas[0]}"] td.models')
        assert "m1" in held
        tab.shot("models")
    finally:
        daemon.cli("delete", "models", "--wait")


def test_a_replica_log_shows_its_lines_and_follows_new_ones(tab: Tab) -> None:
    tab.log_in()
    tab.go("/backends/echo")
    tab.page.wait_for_selector("#replicas tr[data-replica] a[href*='/logs/']")
    tab.page.click("#replicas tr[data-replica] a[href*='/logs/']")
    tab.page.wait_for_url(re.compile(r".*/backends/echo/logs/echo%23[0-9a-f]+$"))
    tab.page.wait_for_function(
        "() => document.querySelector('#log').textContent.includes('serving HTTP')"
    )
    tab.shot("replica-log")
    # A new greeting is taken in place: each replica says so in its log, and the page follows.
    config = tab.daemon.status("echo")["config"]
    greeting = f"hi {time.monotonic_ns()}"
    tab.daemon.api(
        "PUT", "/api/v1/backends/echo", {**config, "user_config": {"greeting": greeting}}
    )
    tab.page.wait_for_function(
        f"() => document.querySelector('#log').textContent.includes({json.dumps(greeting)})"
    )


def test_undo_and_delete_ask_first_and_act_through_the_api(tab: Tab) -> None:
    daemon = tab.daemon
    spec = {
        "entrypoint": "echo_replica:Echo",
        "num_replicas": 1,
        "version": "v1",
        "graceful_shutdown_timeout_s": 2,
        "resources": {"CPU": 0.1},
    }
    daemon.api("PUT", "/api/v1/backends/scratch", spec)
    # An undo goes back to a revision that completed: v1 must have.
    daemon.wait_until("v1 rolled out", lambda: _done(daemon.status("scratch"), "v1"))
    daemon.api("PUT", "/api/v1/backends/scratch", {**spec, "version": "v2"})
    daemon.wait_until("v2 rolled out", lambda: _done(daemon.status("scratch"), "v2"))
    tab.log_in()
    tab.go("/backends/scratch")
    tab.page.wait_for_selector("#revisions tr")
    tab.page.click("button:has-text('Undo')")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    tab.page.click("#confirm-ok")
    daemon.wait_until("rolled back to v1", lambda: _done(daemon.status("scratch"), "v1"))
    newest = daemon.api("GET", "/api/v1/backends/scratch/revisions")["revisions"][-1]
    assert (newest["version"], newest["cause"]["via"], newest["restores"]) == ("v1", "console", 1)

    # A restart asks first, and replaces the replicas with the same content, as a revision.
    tab.page.click("button:has-text('Restart')")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    tab.page.click("#confirm-ok")
    tab.page.wait_for_function(
        "() => document.body.textContent.includes('Restarting scratch as revision 4')"
    )
    newest = daemon.api("GET", "/api/v1/backends/scratch/revisions")["revisions"][-1]
    assert (newest["number"], newest["restarts"], newest["cause"]["via"]) == (4, 3, "console")
    restarted = f"v1+restart.{daemon.status('scratch')['generation']}"
    daemon.wait_until("restarted", lambda: _done(daemon.status("scratch"), restarted))

    tab.page.click("button:has-text('Delete')")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    assert tab.page.is_disabled("#confirm-ok")  # until the name is typed
    tab.page.fill("#confirm-dialog input", "scratc")
    assert tab.page.is_disabled("#confirm-ok")
    tab.page.fill("#confirm-dialog input", "scratch")
    tab.shot("delete-dialog")
    tab.page.click("#confirm-ok")
    daemon.wait_until("scratch deleted", lambda: "scratch" not in _names(daemon))
    tab.page.wait_for_function("() => document.body.textContent.includes('does not exist')")


def test_a_canary_release_shows_its_step_and_is_promoted_and_aborted_from_its_page(
    tab: Tab,
) -> None:
    daemon = tab.daemon
    spec = {
        "entrypoint": "echo_replica:Echo",
        "num_replicas": 1,
        "version": "v1",
        "graceful_shutdown_timeout_s": 2,
        "resources": {"CPU": 0.1},
        "canary": {"steps": [{"weight": 50, "pause_s": 3600}]},
    }
    daemon.api("PUT", "/api/v1/backends/bird", spec)
    daemon.wait_until("v1 rolled out", lambda: _done(daemon.status("bird"), "v1"))
    daemon.api("PUT", "/api/v1/backends/bird", {**spec, "version": "v2"})

    def judging() -> bool:
        canary = (daemon.status("bird")["rollout"] or {}).get("canary") or {}
        return canary.get("phase") == "judging"

    daemon.wait_until("v2 judged as a canary", judging)
    tab.log_in()
    tab.go("/backends/bird")
    tab.page.wait_for_selector("#canary")
    step = tab.page.text_content("#canary-step") or ""
    assert "Step 1 of 1 at 50%, judging" in step, step
    assert tab.page.text_content("#canary tr[data-side='stable']") is not None
    tab.shot("canary")
    tab.page.click("#promote")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    tab.page.click("#confirm-ok")
    tab.page.wait_for_function(
        "() => document.body.textContent.includes('Promoted revision 2 of bird')"
    )
    daemon.wait_until("v2 promoted and rolled out", lambda: _done(daemon.status("bird"), "v2"))
    promoted = [e for e in daemon.status("bird")["events"] if e["kind"] == "CanaryPromoted"]
    assert "promoted by a person (console)" in promoted[-1]["message"]

    daemon.api("PUT", "/api/v1/backends/bird", {**spec, "version": "v3"})
    daemon.wait_until("v3 judged as a canary", judging)
    tab.page.wait_for_selector("#abort")
    tab.page.click("#abort")
    tab.page.wait_for_selector("#confirm-dialog[open]")
    tab.page.click("#confirm-ok")
    daemon.wait_until("back to v2", lambda: _done(daemon.status("bird"), "v2"))
    kept = daemon.api("GET", "/api/v1/backends/bird/revisions")["revisions"]
    assert [(r["version"], r["outcome"]) for r in kept] == [
        ("v1", "complete"),
        ("v2", "complete"),
        ("v3", "failed"),
        ("v2", "complete"),
    ]
    assert "aborted by a person (console)" in kept[2]["error"]
    # Gone from sight: the rollout's section is hidden once it completes (with the panel in it,
    # if the page saw no state between the abort and the completion, as on a loaded machine).
    tab.page.wait_for_selector("#canary", state="hidden")
    daemon.api("DELETE", "/api/v1/backends/bird")
    daemon.wait_until("bird deleted", lambda: "bird" not in _names(daemon))


def test_a_failed_start_shows_its_error_traceback_and_log_until_the_backend_is_healthy(
    tab: Tab,
) -> None:
    daemon = tab.daemon
    spec = {
        "entrypoint": "echo_replica:Echo",
        "num_replicas": 1,
        "version": "v1",
        # Milliseconds as a word: Echo's __init__ fails on it, in the user's own file.
        "init_kwargs": {"work_ms": "five"},
        "graceful_shutdown_timeout_s": 2,
        "resources": {"CPU": 0.1},
    }
    daemon.api("PUT", "/api/v1/backends/broken", spec)
    try:
        daemon.wait_until(
            "broken's deploy failed", lambda: daemon.status("broken")["state"] == "DEPLOY_FAILED"
        )
        failed = daemon.status("broken")["failed_starts"]
        assert len(failed) == 3
        tab.log_in()
        tab.go("/backends/broken")
        tab.page.wait_for_selector('h1 .badge[data-state="DEPLOY_FAILED"]')
        tab.page.wait_for_function(
            "() => document.querySelectorAll('#failed-starts .failed-start').length === 3"
        )
        last = f'#failed-starts .failed-start[data-replica="{failed[-1]["replica"]}"]'
        assert tab.page.inner_text(f"{last} .error-type") == "TypeError"
        assert tab.page.inner_text(f"{last} .error-message") == (
            "unsupported operand type(s) for /: 'str' and 'int'"
        )
        traceback = tab.page.inner_text(f"{last} pre.traceback")
        assert 'examples/echo_replica.py", line' in traceback
        assert "self.work_s = work_ms / 1000" in traceback
        assert tab.page.inner_text("#last-error").startswith("Last error: TypeError: unsupported")
        rollout = tab.page.inner_text("#rollout")
        assert "From nothing (first deploy) to revision 1: failed" in rollout
        assert "None: no replica of any version" in rollout
        assert "revision -" not in rollout
        tab.page.wait_for_selector("#no-replicas:not([hidden])")
        assert "failed starts" in tab.page.inner_text("#no-replicas")
        tab.shot("backend-failed")

        # The kept log of a replica that is gone.
        tab.page.click(f"{last} a[href*='/logs/']")
        tab.page.wait_for_url(re.compile(r".*/backends/broken/logs/broken%23[0-9a-f]+$"))
        tab.page.wait_for_function(
            "() => document.querySelector('#log').textContent.includes('TypeError: unsupported')"
        )
        assert "echo_replica.py" in tab.page.inner_text("#log")
        tab.page.wait_for_selector('.log-meta .badge[data-state="GONE"]')

        # Fixed: once healthy, nothing of the failure stays but its events.
        daemon.api("PUT", "/api/v1/backends/broken", {**spec, "version": "v2", "init_kwargs": {}})
        tab.go("/backends/broken")
        tab.page.wait_for_selector('h1 .badge[data-state="HEALTHY"]')
        tab.page.wait_for_selector("#replicas tr[data-replica]")
        assert tab.page.is_hidden("#last-error")
        assert tab.page.is_hidden("#failed-starts")
        assert tab.page.is_hidden("#rollout")
        status = daemon.status("broken")
        assert (status["last_error"], status["failed_starts"]) == (None, [])
        assert "StartFailed" in tab.page.inner_text("#events")
    finally:
        daemon.api("DELETE", "/api/v1/backends/broken?force=true")
        daemon.wait_until("broken deleted", lambda: "broken" not in _names(daemon))


def _done(status: dict[str, Any], version: str) -> bool:
    return bool(status["goal_done"] and status["version"] == version and status["ready"] == 1)


def _names(daemon: Daemon) -> set[str]:
    return {b["name"] for b in daemon.api("GET", "/api/v1/backends")["backends"]}


def test_an_application_shows_as_a_unit_with_its_members_on_the_overview(tab: Tab) -> None:
    daemon = tab.daemon
    member = {
        "entrypoint": "echo_replica:Echo",
        "num_replicas": 1,
        "version": "v1",
        "graceful_shutdown_timeout_s": 2,
        "resources": {"CPU": 0.1},
    }
    body = {
        "backends": {"front": {**member, "route_prefix": "/front"}, "back": member},
        "applications": {"pair": {"entry": "front", "backends": ["back"]}},
    }
    daemon.api("POST", "/api/v1/apply", body)
    try:
        tab.log_in()
        row = 'tr[data-application="pair"]'
        tab.page.wait_for_selector(row)
        tab.page.wait_for_selector(f'{row} .badge[data-state="HEALTHY"]')
        text = tab.page.inner_text(row)
        assert "front (entry)" in text
        assert "back" in text
        links = tab.page.eval_on_selector_all(
            f"{row} .members a", "links => links.map(a => a.getAttribute('href'))"
        )
        assert links == ["/backends/front", "/backends/back"]
        tab.shot("applications")
    finally:
        daemon.api("DELETE", "/api/v1/applications/pair?force=true")
        daemon.wait_until("pair deleted", lambda: not {"front", "back"} & _names(daemon))
