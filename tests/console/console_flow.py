"""Drives the Herald console in headless Chromium (the system's chromium and chromedriver)
against a live `herald serve` that tests/it/console.rs seeded. Every check is something a
user would see; a failed check raises, and the script exits non-zero (issue 29's console
items each run on their own: every one that fails is reported, with a screenshot). Prints a
JSON summary (page load times in ms) on stdout; saves a PNG of each page under the
screenshot directory, named by what it shows.

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
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT = 30


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("HERALD_CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    # The browser's console messages (a CSP refusal is one), for `driver.get_log("browser")`.
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=os.environ.get("HERALD_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


class Console:
    def __init__(self, driver, base, shots):
        self.d, self.base, self.shots = driver, base, shots
        self.failures = []
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

    def shot(self, name, at=None):
        """A PNG of the window, scrolled to the top or to what `at` (CSS) finds."""
        os.makedirs(self.shots, exist_ok=True)
        self.d.execute_script(
            "const el = arguments[0] && document.querySelector(arguments[0]);"
            "if (el) el.scrollIntoView({block: 'center'}); else window.scrollTo(0, 0)", at)
        self.d.save_screenshot(os.path.join(self.shots, f"{name}.png"))

    def sign_in(self, token, tenant=""):
        self.d.get(f"{self.base}/console")
        self.d.execute_script("sessionStorage.clear()")
        self.d.refresh()
        self.find("input[name=token]").send_keys(token)
        self.d.find_element(By.CSS_SELECTOR, "input[name=tenant]").send_keys(tenant)
        self.d.find_element(By.CSS_SELECTOR, "form.signin button[type=submit]").click()

    def sign_out(self):
        # None when a failed check left the console signed out.
        for button in self.d.find_elements(By.XPATH, "//button[text()='Sign out']")[:1]:
            button.click()
            self.find("form.signin")

    def no_script_ran(self):
        assert self.d.execute_script("return window.__xss") is None, "a stored payload ran as script"

    def alert(self, text):
        return self.text_in("#alert", text)

    def item(self, name, check, *args):
        """Runs one check; a failure is kept (with a screenshot) and reported with the others
        at the end, so one run shows every item that fails."""
        try:
            check(self, *args)
        except Exception as e:  # noqa: BLE001 -- reported at the end
            self.failures.append(f"{name}: {type(e).__name__}: {e}")
            self.shot(f"failed-{name}")

    def absent(self, css):
        """Nothing matches `css` on the page as it is now (call once the page has arrived)."""
        found = self.d.find_elements(By.CSS_SELECTOR, css)
        assert not found, f"{css} is on the page: {[e.text for e in found]}"

    def buttons(self):
        return [b.text for b in self.d.find_elements(By.CSS_SELECTOR, "main button")]


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
    c.item("14-header-drawn-once", header_drawn_once)
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
    # Test send is offered to the admin too (the portal test sends one): with no example in
    # this catalog, the section says so.
    assert "no type with an example" in c.find("#test-send").text
    c.shot("endpoint")


def audit_log(c, times):
    """The tenant's audit log: the seeding's endpoint creations, by the admin; the kind filter."""
    times["audit"] = c.go("#/audit", "#page-audit")
    row = row_of(c, "POST /v1/tenants/{tenant}/endpoints")
    cols = headers(c)
    assert row[cols.index("Actor")] == "admin" and row[cols.index("Resource")].startswith("endpoint ep_"), row
    assert "url" in row[cols.index("Fields set")].split(", "), row
    kind = c.find("main form input[name=kind]")
    kind.send_keys("token")
    c.d.find_element(By.CSS_SELECTOR, "main form[role=search] button[type=submit]").click()
    c.wait.until(lambda d: "kind=token" in d.execute_script("return location.hash"))
    c.arrived("#page-audit")
    assert not any("/endpoints" in tr.text for tr in c.d.find_elements(By.CSS_SELECTOR, "main tbody tr"))
    c.no_script_ran()
    c.shot("audit")


def header_drawn_once(c):
    """Issue 29 #14: the header is drawn once after an admin sign-in (it was drawn twice)."""
    c.arrived("#page-overview")
    who = c.find("#who")
    signs_out = c.d.find_elements(By.XPATH, "//*[@id='who']//button[text()='Sign out']")
    pickers = c.d.find_elements(By.CSS_SELECTOR, "#who select")
    c.shot("header-after-admin-sign-in")
    assert (len(signs_out), len(pickers)) == (1, 1), who.text
    assert who.text.count("admin") == 1, who.text


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


def unknown_ids_inline(c):
    """Issue 29 #15: an unknown event or endpoint id is said inside the page, which keeps its
    heading and its search form (the whole page was replaced)."""
    c.go("#/deliveries?event=evt_nope", "#page-deliveries")
    c.shot("unknown-event-error-inline")
    searched = c.d.find_elements(By.CSS_SELECTOR, "main form[role=search] input[name=event]")
    assert searched, "the search form is gone"
    assert searched[0].get_attribute("value") == "evt_nope", searched[0].get_attribute("value")
    problem = c.d.find_elements(By.CSS_SELECTOR, "main .problem")
    assert problem and "not_found" in problem[0].text, "no error in the page"
    assert "evt_nope" in problem[0].text, problem[0].text
    c.go("#/endpoints/ep_nope", "#page-endpoints")
    c.shot("unknown-endpoint-error-inline")
    heading = c.d.find_elements(By.CSS_SELECTOR, "main h1")
    assert heading and "ep_nope" in heading[0].text, "no heading"
    problem = c.d.find_elements(By.CSS_SELECTOR, "main .problem")
    assert problem and "not_found" in problem[0].text, "no error in the page"
    assert c.d.find_elements(By.CSS_SELECTOR, "main a[href='#/endpoints']"), "no way back to the list"


def reason_counts_without_bullets(c):
    """Issue 29 #17: the counts by reason are chips, with no list bullet drawn over them."""
    c.go("#/dead-letters", "#page-dead-letters")
    chips = c.d.find_elements(By.CSS_SELECTOR, "#reason-counts li")
    assert chips, "no counts by reason"
    c.shot("dead-letter-reason-counts")
    styles = [c.d.execute_script("return getComputedStyle(arguments[0]).listStyleType", li) for li in chips]
    assert all(s == "none" for s in styles), styles


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


def pinned_binding_kept(c, cfg):
    """Issue 29 #3: a pinned binding (`name@version`) shows in its hook's selector, and saving
    the bindings keeps it (it showed "none" and saving dropped it)."""
    c.go(f"#/endpoints/{cfg['plugin_endpoint']}", "#page-endpoints")
    pick = lambda hook: Select(c.d.find_element(By.CSS_SELECTOR, f"main select[name={hook}]"))
    c.shot("pinned-binding-shown", "form[aria-label=Plugins]")
    shown = pick("transform").first_selected_option.text
    assert shown == cfg["pinned"], f"the transform selector shows {shown!r}"
    pick("classify").select_by_value(cfg["classify_plugin"])
    c.d.find_element(By.XPATH, "//button[text()='Bind plugins']").click()
    c.text_in("#status", "Plugin bindings saved.")
    facts = c.text_in("main dl", f"classify: {cfg['classify_plugin']}")
    assert f"transform: {cfg['pinned']}" in facts, facts
    assert pick("transform").first_selected_option.text == cfg["pinned"]
    c.shot("pinned-binding-kept-after-save", "form[aria-label=Plugins]")


def upload_broken_plugin(c, cfg, times):
    c.go("#/plugins", "#page-plugins")
    c.find("input[name=name]").send_keys("broken")
    c.d.find_element(By.CSS_SELECTOR, "input[type=file]").send_keys(cfg["broken_plugin"])
    c.d.find_element(By.XPATH, "//button[text()='Upload']").click()
    result = c.text_in("#upload-result", "invalid_plugin")
    assert result.startswith("Refused: invalid_plugin:"), result
    c.alert("invalid_plugin")
    c.shot("plugins", "#upload-result")


def read_only_tenant(c, cfg):
    """A read-only tenant token sees its tenant's pages and none of the actions its scopes do
    not allow (issue 29 #16: every button showed, and a click got a 403)."""
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
    c.shot("read-only-endpoint-without-actions", "#actions")
    assert c.buttons() == [], c.buttons()
    c.absent("main input[name=rate_per_sec]")
    assert "manage" in c.find("#actions").text, c.find("#actions").text
    c.go("#/dead-letters", "#page-dead-letters")
    c.shot("read-only-dead-letters-without-replay")
    c.absent("#replay-filter, #replay-selected, main input[type=checkbox]")
    assert "replay" in c.find("#replay-actions").text
    c.go("#/plugins", "#page-plugins")
    c.shot("read-only-plugins-without-upload")
    c.absent("main input[type=file]")
    assert "Upload" not in c.buttons(), c.buttons()
    assert "manage" in c.find("#upload").text


def other_tenant_is_invisible(c, cfg):
    c.sign_out()
    c.sign_in(cfg["read_token"], cfg["other_tenant"])
    message = c.alert("not_found")
    assert c.d.execute_script("return sessionStorage.getItem('herald.console')") is None, "signed in anyway"
    assert cfg["other_url"] not in c.d.page_source, "another tenant's endpoint is on the page"
    c.shot("other-tenant-refused")
    return message


def tenant_token_without_its_tenant(c, cfg):
    """A tenant token signs in without its tenant id: the API tells the console whose it is."""
    c.sign_in(cfg["read_token"])
    c.find("main > #page-endpoints")
    who = c.find("#who").text
    assert who.startswith(f"tenant {cfg['tenant']}"), who
    row_of(c, cfg["healthy_url"])


def oauth2_state_shown(c, cfg):
    """Issue 32: an OAuth2 endpoint's page shows its settings (never the secret), the
    token's state on this node and the last token error; issue 51.7: its delivery status."""
    c.go(f"#/endpoints/{cfg['oauth2_endpoint']}", "#page-endpoints")
    auth = c.text_in("#auth", "Last token error")
    for shown in ["OAuth2 token URL", cfg["oauth2_client"], "failing", "connection_refused"]:
        assert shown in auth, (shown, auth)
    assert cfg["oauth2_secret"] not in c.d.page_source, "the client secret is on the page"
    # Issue 51.7: held for a human (its token), its latest failure's category beside it.
    page = c.text_in("#page-endpoints", "Delivery status")
    assert "paused since" in page and "credentials at" in page, page
    c.shot("endpoint-oauth2", "#auth")


def run(c, steps):
    """Runs `steps()` in the browser of `c`, then quits it. An error saves failure.png, says
    the page's alert and the browser's last log lines, and the checks that had failed
    before it; checks that failed (`c.item`) fail the run. Returns what `steps` returned."""
    d = c.d
    try:
        out = steps()
    except Exception:
        try:
            d.save_screenshot(os.path.join(c.shots, "failure.png"))
            print("the page's alert and status: " + repr(d.execute_script(
                "return [document.getElementById('alert')?.textContent, document.getElementById('status')?.textContent]")),
                file=sys.stderr)
            print("the browser's log: " + repr(d.get_log("browser")[-10:]), file=sys.stderr)
        finally:
            if c.failures:
                print("Checks that failed before this:\n" + "\n".join(c.failures), file=sys.stderr)
            raise
    finally:
        d.quit()
    if c.failures:
        raise AssertionError("\n".join(c.failures))
    return out


def flow(cfg):
    times = {}
    c = Console(browser(), cfg["base"], cfg["screenshots"])

    def steps():
        admin_pages(c, cfg, times)
        find_delivery(c, cfg, times)
        audit_log(c, times)
        c.item("15-unknown-ids-inline", unknown_ids_inline)
        c.item("17-reason-counts-without-bullets", reason_counts_without_bullets)
        replay_dead_letters(c, cfg, times)
        plugin_failures(c, cfg, times)
        c.item("3-pinned-binding-kept", pinned_binding_kept, cfg)
        c.item("32-oauth2-state-shown", oauth2_state_shown, cfg)
        upload_broken_plugin(c, cfg, times)
        c.item("16-read-only-token-offered-only-what-it-may", read_only_tenant, cfg)
        other = other_tenant_is_invisible(c, cfg)
        tenant_token_without_its_tenant(c, cfg)
        c.no_script_ran()
        return other
    other = run(c, steps)
    print(json.dumps({"page_ms": times, "other_tenant": other}))


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
