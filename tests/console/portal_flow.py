"""Drives the customer portal (`/console/portal`) in headless Chromium against a live
`herald serve` that tests/it/portal_browser.rs seeded: a minted link opened, its code gone
from the URL and the history, the tenant's branding, an endpoint created, a test send and
its attempt, the catalog, its endpoints' audit log, deliveries, nothing of another tenant,
refusal after revocation and after expiry, and the portal framed by an allowed origin but
refused (by CSP) in a frame of another. Links are minted here, with the admin token, as the
platform's backend would, just before each is opened. Prints a JSON summary (page load times in ms) on stdout;
saves a PNG of each page under the screenshot directory.

Usage: portal_flow.py CONFIG.json   (written by tests/it/portal_browser.rs)
"""

import json
import sys
import time
import urllib.request
from urllib.parse import quote

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from console_flow import Console, browser, run

EXPIRED = "this portal link has expired; ask for a new one"


class Portal(Console):
    def __init__(self, driver, cfg):
        super().__init__(driver, cfg["base"], cfg["screenshots"])
        self.cfg = cfg

    def admin(self, method, path, body=None):
        """The platform's backend: the API with the admin token; returns (status, JSON)."""
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.cfg['admin_token']}",
                                              "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read().decode()
                return r.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "null")

    def mint(self, **body):
        status, s = self.admin("POST", f"/v1/tenants/{self.cfg['tenant']}/portal-sessions", body)
        assert status == 201, (status, s)
        return s

    def state_of(self, session):
        _, listed = self.admin("GET", f"/v1/tenants/{self.cfg['tenant']}/portal-sessions")
        return next(s["state"] for s in listed["data"] if s["id"] == session["id"])

    def open_link(self, session):
        """Opens a minted link in this tab; returns the ms until the endpoints page showed."""
        start = time.monotonic()
        self.d.get(self.base + session["url"])
        self.find("main > #page-endpoints")
        return round((time.monotonic() - start) * 1000, 1)

    def refused_with(self, text):
        """Reloads until the page says `text` (each load asks the API again)."""
        def said(d):
            d.refresh()
            found = d.find_elements(By.CSS_SELECTOR, "main .problem, main [role=alert]")
            return any(text in e.text for e in found)
        WebDriverWait(self.d, 20, poll_frequency=0.5).until(said)


def opened_link_leaves_no_code(p, times):
    s = p.mint()
    times["open_link_to_endpoints"] = p.open_link(s)
    code = s["url"].split("#code=")[1]
    href = p.d.execute_script("return location.href")
    assert "code=" not in href and code not in href, href
    # The link's history entry was replaced: back, then forward again, is the portal
    # without its fragment (and still signed in, from this tab's session storage).
    p.d.back()
    p.wait.until(lambda d: not d.current_url.startswith(p.base))
    p.d.forward()
    p.find("main > #page-endpoints")
    href = p.d.execute_script("return location.href")
    assert "code=" not in href and code not in href, href
    stored = p.d.execute_script("return sessionStorage.getItem('herald.console')")
    assert code not in stored and '"portal"' in stored, stored
    assert p.state_of(s) == "active"
    p.shot("portal-endpoints")
    return s


def branded_and_nothing_of_the_operator(p):
    brand = p.find("header .brand")
    assert brand.text == p.cfg["brand_name"], brand.text
    # The name is text: its markup made no element.
    assert not p.d.find_elements(By.CSS_SELECTOR, "header .brand b")
    assert p.d.find_element(By.CSS_SELECTOR, "header .brand img.logo").get_attribute("src").startswith("data:image/png")
    accent = p.d.execute_script("return getComputedStyle(document.documentElement).getPropertyValue('--accent').trim()")
    assert accent == p.cfg["brand_accent"], accent
    nav = [a.text for a in p.d.find_elements(By.CSS_SELECTOR, "#nav a")]
    assert nav == ["Endpoints", "Event catalog", "Deliveries", "Dead letters", "Audit log"], nav
    p.absent("#tenant-picker")
    assert "Sign in" not in p.d.find_element(By.TAG_NAME, "body").text


def create_and_test_send(p, times):
    p.find("form[aria-label='Add an endpoint'] input[name=url]").send_keys(p.cfg["receiver_url"])
    p.d.find_element(By.CSS_SELECTOR, "form[aria-label='Add an endpoint'] input[name=description]").send_keys("my receiver")
    p.d.find_element(By.CSS_SELECTOR, "form[aria-label='Add an endpoint'] button").click()
    p.find("main > #page-endpoints #test-send")
    Select(p.find("#test-send select[name=event_type]")).select_by_value(p.cfg["event_type"])
    start = time.monotonic()
    p.d.find_element(By.CSS_SELECTOR, "#test-send button[type=submit]").click()
    result = p.text_in("#test-send-result", "Verdict")
    times["test_send_to_attempt_shown"] = round((time.monotonic() - start) * 1000, 1)
    assert "Status\n200" in result, result
    p.shot("portal-test-send-attempt", "#test-send")


def catalog(p, times):
    times["catalog"] = p.go("#/catalog", "#page-catalog")
    row = p.text_in("main table", p.cfg["event_type"])
    assert p.cfg["event_type_description"] in row, row
    p.shot("portal-catalog")
    times["catalog_type"] = p.go(f"#/catalog/{p.cfg['event_type']}", "#page-catalog")
    assert p.cfg["example_marker"] in p.text_in("#examples", p.cfg["example_marker"])
    assert '"$schema"' in p.find("#schemas pre").text
    p.shot("portal-catalog-type")


def audit_log_of_its_endpoints(p, times):
    """The session's own changes, named by it; nothing of the operator's (tokens, sessions)."""
    times["audit"] = p.go("#/audit", "#page-audit")
    rows = p.text_in("main table", "/test-send")
    assert "portal:ps_" in rows and "/endpoints" in rows, rows
    assert "portal-sessions" not in rows and "tokens" not in rows, rows
    assert not p.d.find_elements(By.CSS_SELECTOR, "main form input[name=kind]")
    p.shot("portal-audit")


def deliveries_and_no_other_tenant(p, times):
    times["deliveries"] = p.go("#/deliveries", "#page-deliveries")
    p.text_in("main table", p.cfg["event_type"])
    times["dead_letters"] = p.go("#/dead-letters", "#page-dead-letters")
    times["endpoints"] = p.go("#/endpoints", "#page-endpoints")
    assert p.cfg["other_url"] not in p.d.find_element(By.TAG_NAME, "body").text
    status = p.d.execute_script(
        "const s = JSON.parse(sessionStorage.getItem('herald.console'));"
        "return fetch('/v1/tenants/' + arguments[0] + '/endpoints', {headers: {Authorization: 'Bearer ' + s.token}})"
        ".then(r => r.status)", p.cfg["other_tenant"])
    assert status == 404, status
    p.shot("portal-deliveries")


def revoked(p, session):
    status, _ = p.admin("DELETE", f"/v1/tenants/{p.cfg['tenant']}/portal-sessions/{session['id']}")
    assert status == 204, status
    p.refused_with(EXPIRED)
    # Still the tenant's portal, in its colours, saying what happened.
    assert p.find("header .brand").text == p.cfg["brand_name"]
    p.shot("portal-revoked")


def used_link_refused(p, session):
    p.d.get(p.base + session["url"])
    p.text_in("main", "ask for a new one")
    p.shot("portal-link-used")


def expired(p):
    s = p.mint(ttl_secs=p.cfg["min_ttl"])
    p.open_link(s)
    p.refused_with(EXPIRED)
    p.shot("portal-expired")


def framed(p, times):
    allowed = p.mint()
    start = time.monotonic()
    p.d.get(p.cfg["allowed_host"] + "#" + quote(p.base + allowed["url"], safe=""))
    p.wait.until(lambda d: d.find_element(By.ID, "portal"))
    p.d.switch_to.frame("portal")
    p.find("main > #page-endpoints")
    times["framed_open_to_endpoints"] = round((time.monotonic() - start) * 1000, 1)
    p.d.switch_to.default_content()
    p.shot("portal-framed-allowed")
    assert p.state_of(allowed) == "active"

    denied = p.mint()
    p.d.get_log("browser")  # drop what came before
    p.d.get(p.cfg["denied_host"] + "#" + quote(p.base + denied["url"], safe=""))
    logs = []

    def refused(d):
        logs.extend(d.get_log("browser"))
        return any("frame-ancestors" in e["message"] for e in logs)
    WebDriverWait(p.d, 20, poll_frequency=0.2).until(refused)
    p.d.switch_to.frame("portal")
    app = p.d.execute_script("return document.querySelector('main#main') !== null")
    p.d.switch_to.default_content()
    assert not app, "the refused frame rendered the portal"
    p.shot("portal-framed-denied")
    # The refused page never ran: its link was never exchanged.
    assert p.state_of(denied) == "pending"
    return next(e["message"] for e in logs if "frame-ancestors" in e["message"])


def flow(cfg):
    times = {}
    p = Portal(browser(), cfg)

    def steps():
        s = opened_link_leaves_no_code(p, times)
        p.item("branded-and-nothing-of-the-operator", branded_and_nothing_of_the_operator)
        create_and_test_send(p, times)
        p.item("catalog", catalog, times)
        p.item("audit-log-of-its-endpoints", audit_log_of_its_endpoints, times)
        p.item("deliveries-and-no-other-tenant", deliveries_and_no_other_tenant, times)
        p.no_script_ran()
        revoked(p, s)
        used_link_refused(p, s)
        expired(p)
        return framed(p, times)
    csp = run(p, steps)
    print(json.dumps({"page_ms": times, "csp_refusal": csp}))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        flow(json.load(f))
