"""Drives the Herald console in headless Chromium (the system's chromium and chromedriver)
against a live `herald serve` that tests/it/console.rs seeded. Every check is something a
user would see; a failed check raises, and the script exits non-zero. Prints a JSON summary
(page load times in ms) on stdout; saves a PNG of each page under the screenshot directory.

Usage: console_flow.py CONFIG.json   (written by tests/it/console.rs)
       console_flow.py --measure BASE ADMIN_TOKEN SCREENSHOT_DIR   (page loads only)
"""

import json
import os
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 30


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("HERALD_CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    service = Service(executable_path=os.environ.get("HERALD_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


class Console:
    def __init__(self, driver, base, shots):
        self.d, self.base, self.shots = driver, base, shots
        # A page re-renders as a whole: an element found a moment ago may be gone; look again.
        self.wait = WebDriverWait(driver, WAIT, poll_frequency=0.01,
                                  ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))

    def find(self, css):
        return self.wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))

    def text_in(self, css, text):
        self.wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
        return self.d.find_element(By.CSS_SELECTOR, css).text

    def go(self, hash_, page_css):
        """Moves to `#/…` and waits for the page; returns the milliseconds it took."""
        start = time.monotonic()
        self.d.execute_script("location.hash = arguments[0]", hash_)
        self.arrived(page_css)
        return round((time.monotonic() - start) * 1000, 1)

    def arrived(self, page_css):
        """Waits until the page rendered for the current `location.hash` is shown."""
        self.wait.until(lambda d: d.execute_script(
            "const p = document.querySelector('main > div[data-route]');"
            "return p !== null && p.dataset.route === location.hash && p.matches(arguments[0])", page_css))

    def shot(self, name):
        os.makedirs(self.shots, exist_ok=True)
        self.d.save_screenshot(os.path.join(self.shots, f"{name}.png"))

    def sign_in(self, token, tenant=""):
        self.d.get(f"{self.base}/console")
        self.d.execute_script("sessionStorage.clear()")
        self.d.refresh()
        self.find("input[name=token]").send_keys(token)
        self.d.find_element(By.CSS_SELECTOR, "input[name=tenant]").send_keys(tenant)
        self.d.find_element(By.CSS_SELECTOR, "form.signin button[type=submit]").click()

    def sign_out(self):
        self.d.find_element(By.XPATH, "//button[text()='Sign out']").click()
        self.find("form.signin")

    def no_script_ran(self):
        assert self.d.execute_script("return window.__xss") is None, "a stored payload ran as script"

    def alert(self, text):
        return self.text_in("#alert", text)


def row_of(c, table_text):
    """The table row (as a list of cell texts) whose text contains `table_text`."""
    for tr in c.d.find_elements(By.CSS_SELECTOR, "main tbody tr"):
        if table_text in tr.text:
            return [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
    raise AssertionError(f"no row with {table_text!r}")


def headers(c):
    return [th.text for th in c.d.find_elements(By.CSS_SELECTOR, "main thead th")]


def admin_pages(c, cfg, times):
    c.sign_in(cfg["admin_token"])
    c.find("main > #page-overview")
    cards = c.find("#overview-cards").text
    assert "Tenants" in cards and "2" in cards, cards
    assert "Dead letters" in cards, cards
    c.find("main canvas")
    c.shot("overview")
    times["overview"] = c.go("#/overview", "#page-overview")

    # Endpoints: the success rate beside the rate setting, in the same row.
    times["endpoints"] = c.go("#/endpoints", "#page-endpoints")
    cols = headers(c)
    assert cols.index("Success 1 h") == cols.index("Max in flight") + 1, cols
    assert cols.index("Rate /s") < cols.index("Success 1 h"), cols
    row = row_of(c, cfg["healthy_url"])
    assert row[cols.index("Rate /s")] == "7", row
    assert row[cols.index("Success 1 h")] == "100.0 %", row
    assert row[cols.index("Success 24 h")] == "100.0 %", row
    # The hostile description is shown as the text it is.
    assert row[cols.index("Description")] == cfg["xss_description"], row
    c.no_script_ran()
    c.shot("endpoints")

    c.d.find_element(By.LINK_TEXT, cfg["healthy_url"]).click()
    c.wait.until(lambda d: "#/endpoints/" in d.execute_script("return location.hash"))
    c.arrived("#page-endpoints")
    assert "100.0 % of" in c.find("main dl").text
    c.shot("endpoint")


def find_delivery(c, cfg, times):
    times["deliveries"] = c.go("#/deliveries", "#page-deliveries")
    c.find("input[name=event]").send_keys(cfg["failed_event"])
    c.d.find_element(By.CSS_SELECTOR, "form[role=search] button").click()
    c.wait.until(lambda d: "event=" in d.execute_script("return location.hash"))
    c.arrived("#page-deliveries")
    assert cfg["failed_event"] in c.find("main caption").text
    c.find("main tbody tr td a").click()
    c.wait.until(lambda d: "#/deliveries/" in d.execute_script("return location.hash"))
    c.arrived("#page-deliveries")
    c.find("main pre.response")
    cols = headers(c)
    row = row_of(c, "422")
    assert row[cols.index("Status")] == "422", row
    assert row[cols.index("Response (first KiB)")] == cfg["xss_body"], row
    assert "permanent:422" in c.find("main dl").text
    # What was sent: the headers as the receiver got them, and the envelope.
    sent = c.find("#sent pre.sent-headers").text
    assert "webhook-signature: v1," in sent, sent
    assert f"webhook-id: {cfg['failed_event']}" in sent, sent
    assert "content-type: application/json" in sent, sent
    body = c.find("#sent pre.sent-body").text
    assert f'"id":"{cfg["failed_event"]}"' in body and '"data":{"n":0}' in body, body
    assert "envelope of the event" in c.find("#sent").text
    c.no_script_ran()
    c.shot("delivery")
    times["delivery"] = c.go(c.d.execute_script("return location.hash"), "#page-deliveries")


def replay_dead_letters(c, cfg, times):
    times["dead_letters"] = c.go("#/dead-letters", "#page-dead-letters")
    counts = c.find("#reason-counts").text
    dead = cfg["dead"]
    assert f"permanent:422: {dead}" in counts, counts
    c.d.find_element(By.PARTIAL_LINK_TEXT, "permanent:422").click()
    c.wait.until(lambda d: "reason=permanent" in d.execute_script("return location.hash"))
    c.arrived("#page-dead-letters")
    assert c.find("input[name=reason]").get_attribute("value") == "permanent:422"
    # A slow replay is cancelled once its first delivery is in: one every ten seconds, so
    # the second is not due yet. The rest stay dead letters.
    rate = c.find("input[name=rate_per_sec]")
    rate.clear()
    rate.send_keys("0.1")
    c.find("main > #page-dead-letters #replay-filter").click()
    c.text_in("#replay-state", "delivered 1,")
    assert "State: running" in c.find("#replay-state").text
    c.find("#replay-cancel").click()
    c.text_in("#replay-progress", "Replay cancelled.")
    state = c.find("#replay-state").text
    assert "State: cancelled" in state, state
    assert f"Selected {dead}, re-queued 1, sent 1, delivered 1, failed 0, back among the dead letters 0, pending 0." in state, state
    assert c.d.find_elements(By.CSS_SELECTOR, "#replay-cancel") == [], "no Cancel once cancelled"
    # The rest, at the default pace, to the end.
    c.d.refresh()
    c.arrived("#page-dead-letters")
    assert "cancelled" in c.find("main > #page-dead-letters table").text, "the cancelled replay is listed"
    c.find("main > #page-dead-letters #replay-filter").click()
    done = c.text_in("#replay-progress", "Replay finished.")
    state = c.find("#replay-state").text
    rest = dead - 1
    figures = f"Selected {rest}, re-queued {rest}, sent {rest}, delivered {rest}, failed 0, back among the dead letters 0, pending 0."
    assert figures in state, state
    assert "State: done" in state, state
    assert "Replay finished." in done
    c.shot("dead-letters")


def plugin_failures(c, cfg, times):
    times["plugins"] = c.go("#/plugins", "#page-plugins")
    cols = headers(c)
    row = row_of(c, "hostile")
    refused = f"refused {cfg['plugin_event']}"
    assert row[cols.index("Calls")] == "1" and row[cols.index("Failures")] == "1", row
    assert row[cols.index("By reason")] == "error: 1", row
    assert refused in row[cols.index("Latest failure")], row
    assert row[cols.index("p50")].endswith(" ms"), row
    assert row[cols.index("Bound by")] == cfg["plugin_endpoint"], row
    c.d.find_element(By.LINK_TEXT, "hostile").click()
    c.wait.until(lambda d: d.execute_script("return location.hash") == "#/plugins/hostile")
    c.arrived("#page-plugins")
    failures = c.find("#recent-failures").text
    assert refused in failures, failures
    assert f"warn: refusing {cfg['plugin_event']}" in c.find("#recent-failures pre.failure-logs").text, failures
    assert "transform" in failures and cfg["plugin_event"] in failures, failures
    bound = c.find("#bound-by").text
    assert cfg["plugin_endpoint"] in bound and "never-sent" in bound, bound
    c.shot("plugin")


def upload_broken_plugin(c, cfg, times):
    c.go("#/plugins", "#page-plugins")
    c.find("input[name=name]").send_keys("broken")
    c.d.find_element(By.CSS_SELECTOR, "input[type=file]").send_keys(cfg["broken_plugin"])
    c.d.find_element(By.XPATH, "//button[text()='Upload']").click()
    result = c.text_in("#upload-result", "invalid_plugin")
    assert result.startswith("Refused: invalid_plugin:"), result
    c.alert("invalid_plugin")
    c.shot("plugins")


def read_only_tenant(c, cfg):
    c.sign_out()
    c.sign_in(cfg["read_token"], cfg["tenant"])
    c.find("main > #page-endpoints")
    nav = c.find("#nav").text
    assert "Overview" not in nav and "Endpoints" in nav, nav
    assert c.find("#who").text.startswith(f"tenant {cfg['tenant']}")
    row_of(c, cfg["healthy_url"])
    c.d.find_element(By.LINK_TEXT, cfg["healthy_url"]).click()
    c.wait.until(lambda d: "#/endpoints/" in d.execute_script("return location.hash"))
    c.arrived("#page-endpoints")
    c.d.find_element(By.XPATH, "//button[text()='Pause']").click()
    message = c.alert("forbidden")
    assert "manage" in message, message
    # Nothing changed: the endpoint is still active.
    c.d.refresh()
    c.arrived("#page-endpoints")
    state = c.find("main dl").text
    assert "active" in state and "paused" not in state, state
    c.shot("read-only-tenant")


def other_tenant_is_invisible(c, cfg):
    c.sign_out()
    c.sign_in(cfg["read_token"], cfg["other_tenant"])
    message = c.alert("not_found")
    assert c.d.execute_script("return sessionStorage.getItem('herald.console')") is None, "signed in anyway"
    assert cfg["other_url"] not in c.d.page_source, "another tenant's endpoint is on the page"
    c.shot("other-tenant-refused")
    return message


def flow(cfg):
    times = {}
    d = browser()
    try:
        c = Console(d, cfg["base"], cfg["screenshots"])
        admin_pages(c, cfg, times)
        find_delivery(c, cfg, times)
        replay_dead_letters(c, cfg, times)
        plugin_failures(c, cfg, times)
        upload_broken_plugin(c, cfg, times)
        read_only_tenant(c, cfg)
        other = other_tenant_is_invisible(c, cfg)
        c.no_script_ran()
        print(json.dumps({"page_ms": times, "other_tenant": other}))
    except Exception:
        try:
            d.save_screenshot(os.path.join(cfg["screenshots"], "failure.png"))
        finally:
            raise
    finally:
        d.quit()


def measure(base, token, shots, runs=5):
    """Page loads with the admin token: the first load of /console and each page by hash."""
    d = browser()
    try:
        c = Console(d, base, shots)
        start = time.monotonic()
        c.sign_in(token)
        c.find("main > #page-overview")
        first = round((time.monotonic() - start) * 1000, 1)
        pages = [("#/overview", "#page-overview"), ("#/endpoints", "#page-endpoints"),
                 ("#/deliveries", "#page-deliveries"), ("#/dead-letters", "#page-dead-letters"),
                 ("#/plugins", "#page-plugins")]
        out = {"sign_in_to_overview": first}
        samples = {hash_: [] for hash_, _ in pages}
        # Each load comes from another page, so the wait sees the new page, not the old one.
        for _ in range(runs):
            for hash_, css in pages:
                samples[hash_].append(c.go(hash_, css))
                c.shot("large-" + hash_.strip("#/"))
        for hash_, s in samples.items():
            out[hash_] = sorted(s)[len(s) // 2]
        print(json.dumps({"median_ms": out, "runs": runs}))
    finally:
        d.quit()


if __name__ == "__main__":
    if sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        with open(sys.argv[1]) as f:
            flow(json.load(f))
