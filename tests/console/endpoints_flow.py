"""Endpoints added, edited and deleted in the Herald console and in the customer portal
(headless Chromium against a live `herald serve` that tests/it/console_endpoints.rs
seeded), and what issue 48 (item 24) found rough in both: the pages at 420 px, queue
endpoints' destinations, the test send's example, the operator's detail in the portal,
replays with their filters in a narrow frame, dates typed as UTC, `/`, the favicon, and
Herald's own tenant in the picker. Every check is something a user sees. Prints a JSON
summary (per mode, the endpoint it added and the secret the page showed); saves a PNG of
each step under the console's and the portal's screenshot directories.

Usage: endpoints_flow.py CONFIG.json   (written by tests/it/console_endpoints.rs)
"""

import json
import sys
import time
from urllib.parse import quote

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from console_flow import Console, browser, run
from portal_flow import Portal

NARROW = 420


def hash_of(c):
    return c.d.execute_script("return location.hash")


def set_value(el, text):
    el.clear()
    el.send_keys(text)


FORM = "form[aria-label='Add an endpoint']"


def submit_new(c, description, event_type):
    """Fills the rest of the add form, submits it, and returns the new endpoint's id once its
    page shows, with the news (which survives the navigation to it)."""
    c.find(f"{FORM} input[name=description]").send_keys(description)
    c.find(f"{FORM} input[name=event_types]").send_keys(event_type)
    c.find(f"{FORM} button[type=submit]").click()
    c.wait.until(lambda d: hash_of(c).startswith("#/endpoints/ep_"))
    c.arrived("#page-endpoints")
    endpoint = hash_of(c).split("/")[-1]
    assert f"Endpoint {endpoint} added." in c.find("#status").text, c.find("#status").text
    return endpoint


def add_endpoint(c, cfg, mode):
    """Adds an endpoint from the list's form; on its page, the news and the secret."""
    m = cfg[mode]
    c.go("#/endpoints", "#page-endpoints")
    c.find(f"{FORM} input[name=url]").send_keys(m["url"])
    endpoint = submit_new(c, m["description"], cfg["event_type"])
    secret = c.find("#new-secret-value").get_attribute("value")
    assert secret.startswith("whsec_"), secret
    assert "shown this once" in c.find("#new-secret").text
    c.d.find_element(By.CSS_SELECTOR, "#new-secret button").click()
    # Copied, or (where the clipboard is refused) selected for copying by hand.
    c.wait.until(lambda d: any(w in d.find_element(By.ID, "new-secret").text for w in ("Copied.", "Selected")))
    # Selected for copying by hand, whatever the clipboard allowed.
    selected = c.d.execute_script(
        "const i = document.getElementById('new-secret-value'); return i.value.slice(i.selectionStart, i.selectionEnd)")
    assert selected == secret, selected
    c.shot(f"{mode}-endpoint-added-secret", "#new-secret")
    return endpoint, secret


def add_poll_endpoint(c, cfg, mode):
    """A pull endpoint (kind `poll`) added from the same form: no URL to give; its page says
    that nothing is pushed, who reads it, and its delivery status. Deleted again, so the
    checks after it see the endpoints they did."""
    c.go("#/endpoints", "#page-endpoints")
    url = c.find(f"{FORM} input[name=url]")
    Select(c.find(f"{FORM} select[name=kind]")).select_by_value("poll")
    c.wait.until(lambda d: not url.is_displayed())
    endpoint = submit_new(c, f"pulled by the {mode}'s test", cfg["event_type"])
    assert c.find("#new-secret-value").get_attribute("value").startswith("whsec_")
    facts = c.find("main dl").text
    for shown in ("poll", "none: nothing is pushed", "GET …/poll", "Delivery status"):
        assert shown in facts, f"{shown!r} not in {facts!r}"
    status, stored = c.admin("GET", f"/v1/tenants/{cfg['tenant']}/endpoints/{endpoint}")
    assert status == 200 and stored["kind"] == "poll" and stored["url"] == "", (status, stored)
    c.shot(f"{mode}-poll-endpoint-added", "main dl")
    status, _ = c.admin("DELETE", f"/v1/tenants/{cfg['tenant']}/endpoints/{endpoint}")
    assert status in (200, 204), status


def shown_once(c, endpoint):
    """The secret is not shown again: not on the page reloaded, nor on the list."""
    c.d.refresh()
    c.arrived("#page-endpoints")
    c.find("main dl")
    c.absent("#new-secret")
    assert "whsec_" not in c.find("main").text, "the secret is shown again"


def test_send_example(c, cfg):
    """The test send shows the example it sends: its payload, not a bare number."""
    c.text_in("#test-send-example", cfg["example_marker"])
    options = [o.text for o in c.d.find_elements(By.CSS_SELECTOR, "#test-send select[name=example] option")]
    assert len(options) == 1 and cfg["example_marker"] in options[0], options


def operator_detail(c, mode):
    """The node's egress proxy is the operator's: the console says it, the portal does not."""
    auth = c.find("#auth").text
    if mode == "portal":
        assert "Egress proxy" not in auth and "the node" not in auth, auth
    else:
        assert "Egress proxy" in auth, auth


def edit_endpoint(c, cfg, mode, endpoint):
    m = cfg[mode]
    form = "form[aria-label='Edit endpoint']"
    set_value(c.find(f"{form} input[name=url]"), m["edited_url"])
    set_value(c.find(f"{form} input[name=description]"), m["edited_description"])
    set_value(c.find(f"{form} input[name=event_types]"), cfg["edited_types"])
    set_value(c.find(f"{form} textarea[name=headers]"), m["header"])
    # A content filter the event sent after the edit matches (its payload's mode).
    set_value(c.find(f"{form} textarea[name=filter]"), '{"data.mode": "%s"}' % mode)
    c.find(f"{form} button[type=submit]").click()
    c.text_in("#status", "Endpoint saved.")
    facts = c.text_in("main dl", m["edited_url"])
    for shown in (m["edited_description"], cfg["edited_types"], '{"data.mode":"%s"}' % mode):
        assert shown in facts, (shown, facts)
    assert m["header"].lower() in facts.lower(), facts
    _, saved = c.admin("GET", f"/v1/tenants/{cfg['tenant']}/endpoints/{endpoint}")
    assert saved["filter"] == {"data.mode": mode}, saved
    # The form shows what is saved now.
    assert c.find(f"{form} input[name=url]").get_attribute("value") == m["edited_url"]
    c.shot(f"{mode}-endpoint-edited", form)


def delivered_as_edited(c, cfg, mode, endpoint):
    """An event after the edit: its delivery's page shows the header as the receiver got it."""
    m = cfg[mode]
    status, r = c.admin("POST", f"/v1/tenants/{cfg['tenant']}/events",
                        {"id": m["event"], "type": "order.shipped", "payload": {"mode": mode}})
    assert status == 202, (status, r)
    path = f"/v1/tenants/{cfg['tenant']}/events/{m['event']}/deliveries"
    deadline = time.monotonic() + 30
    while True:
        _, page = c.admin("GET", path)
        delivered = [d for d in page["data"] if d["state"] == "delivered"]
        if delivered:
            break
        assert time.monotonic() < deadline, page
        time.sleep(0.2)
    assert [d["endpoint_id"] for d in page["data"]] == [endpoint], page
    c.go(f"#/deliveries/{delivered[0]['id']}", "#page-deliveries")
    sent = c.find("#sent pre.sent-headers").text
    assert m["header"].lower() in sent.lower(), sent
    c.shot(f"{mode}-edited-delivery-headers", "#sent")


def delete_endpoint(c, cfg, mode, endpoint):
    m = cfg[mode]
    c.go(f"#/endpoints/{endpoint}", "#page-endpoints")
    c.find("#delete-endpoint").click()
    confirm = c.text_in("#delete-confirm", "cannot be undone")
    assert m["edited_url"] in confirm, confirm
    c.shot(f"{mode}-endpoint-delete-confirm", "#delete")
    c.find("#delete-confirmed").click()
    c.wait.until(lambda d: hash_of(c) == "#/endpoints")
    c.arrived("#page-endpoints")
    assert f"Endpoint {endpoint} deleted." in c.find("#status").text, c.find("#status").text
    assert m["edited_url"] not in c.find("main").text, "the deleted endpoint is listed"
    c.shot(f"{mode}-endpoint-deleted")
    status, _ = c.admin("GET", f"/v1/tenants/{cfg['tenant']}/endpoints/{endpoint}")
    assert status == 404, status


def lifecycle(c, cfg, mode):
    endpoint, secret = add_endpoint(c, cfg, mode)
    c.item(f"{mode}-secret-shown-once", shown_once, endpoint)
    c.item(f"{mode}-test-send-example", test_send_example, cfg)
    c.item(f"{mode}-operator-detail", operator_detail, mode)
    edit_endpoint(c, cfg, mode, endpoint)
    delivered_as_edited(c, cfg, mode, endpoint)
    delete_endpoint(c, cfg, mode, endpoint)
    c.item(f"51-{mode}-poll-endpoint", add_poll_endpoint, cfg, mode)
    return {"id": endpoint, "secret": secret}


def overflow(c):
    """What sticks out past the window's right edge: the page's width beyond it, and the
    header's links and controls that end past it."""
    return c.d.execute_script("""
        const w = document.documentElement.clientWidth;
        const past = (css) => [...document.querySelectorAll(css)].filter((e) => e.getBoundingClientRect().right > w + 0.5);
        const header = past('header a, header button, header select, header span').map((e) => e.textContent);
        // The outermost elements of the page that end past the edge, to say what does.
        const main = past('body *').filter((e) => !past('body *').includes(e.parentElement))
          .slice(0, 5).map((e) => `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}.${e.className}`);
        return {width: w, page: document.documentElement.scrollWidth, header, main};""")


def narrow(c, cfg, mode):
    """At 420 px: nothing past the right edge (the menu wraps), and the long URL keeps a
    readable width in its column (it wrapped one character a line)."""
    c.d.set_window_size(NARROW, 900)
    try:
        for hash_, css in (("#/endpoints", "#page-endpoints"), ("#/dead-letters", "#page-dead-letters"),
                           ("#/deliveries", "#page-deliveries"), ("#/catalog", "#page-catalog")):
            c.go(hash_, css)
            o = overflow(c)
            assert o["width"] <= NARROW, o
            assert o["page"] <= o["width"] and not o["header"], (hash_, o)
            if hash_ == "#/endpoints":
                c.shot(f"{mode}-narrow-endpoints")
                url_fits(c, cfg)
        c.go(f"#/endpoints/{cfg['failing_endpoint']}", "#page-endpoints")
        o = overflow(c)
        assert o["page"] <= o["width"] and not o["header"], ("endpoint page", o)
    finally:
        c.d.set_window_size(1400, 1000)
    c.go("#/endpoints", "#page-endpoints")
    url_fits(c, cfg)


def url_fits(c, cfg):
    link = c.d.find_element(By.LINK_TEXT, cfg["long_url"])
    box = c.d.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", link)
    line = c.d.execute_script("return parseFloat(getComputedStyle(arguments[0]).lineHeight)", link)
    # At least 12 characters a line, so the URL is a few lines, not one per character.
    assert box[0] >= 150, f"the URL is {box[0]} px wide"
    assert box[1] / line <= len(cfg["long_url"]) / 12, f"the URL takes {box[1] / line} lines"


def queue_targets(c, cfg):
    """A queue endpoint is listed with where its messages go, not only its broker."""
    c.go("#/endpoints", "#page-endpoints")
    rows = [tr.text for tr in c.d.find_elements(By.CSS_SELECTOR, "main tbody tr")]
    for broker, target in (("nats://", cfg["nats_target"]), ("redis://", cfg["redis_target"])):
        row = next((r for r in rows if broker in r), None)
        assert row and target in row, (target, rows)


def replays_shown(c, cfg):
    """Each recent replay says which dead letters it took, and the table ends inside the
    window: every column shown, nothing to scroll to."""
    c.go("#/dead-letters", "#page-dead-letters")
    table = c.text_in("main table", "chosen by id")
    by_filter = f"endpoint {cfg['failing_endpoint']}, reason permanent:422, since 2000-01-01 00:00:00Z"
    assert by_filter in table, table
    assert f"{cfg['replayed_ids']} chosen by id" in table, table
    within = c.d.execute_script("""
        const w = document.documentElement.clientWidth;
        const replays = document.querySelector('main table');
        return replays.getBoundingClientRect().right <= w && replays.parentElement.scrollWidth <= replays.parentElement.clientWidth
          && document.documentElement.scrollWidth <= w;""")
    assert within, "the replays table runs past the window"


def dates_as_utc(c, cfg):
    """The time fields take a UTC time typed as YYYY-MM-DD hh:mm, and show it as typed."""
    c.go("#/dead-letters", "#page-dead-letters")
    since = c.find("main form[role=search] input[name=since]")
    assert since.get_attribute("placeholder") == "YYYY-MM-DD hh:mm", since.get_attribute("placeholder")
    for typed, rows in (("2000-01-01 00:00", True), ("2999-01-01", False)):
        since = c.find("main form[role=search] input[name=since]")
        set_value(since, typed)
        c.d.find_element(By.CSS_SELECTOR, "main form[role=search] button").click()
        c.wait.until(lambda d: "since=" in hash_of(c) and typed.split(" ")[0] in hash_of(c))
        c.arrived("#page-dead-letters")
        shown = c.find("main form[role=search] input[name=since]").get_attribute("value")
        assert shown == typed, shown
        listed = c.d.find_elements(By.CSS_SELECTOR, "main input[type=checkbox]")
        if rows:
            assert len(listed) == cfg["dead"], f"{len(listed)} dead letters since {typed}"
        else:
            c.text_in("main", "No dead letter matches.")


def root_and_favicon(c):
    """`/` opens the console; the page has an icon, and `/favicon.ico` finds it."""
    c.d.get(c.base + "/")
    c.wait.until(lambda d: d.current_url.rstrip("/").endswith("/console"))
    c.find("main form.signin, main > div[data-route]")
    icons = c.d.execute_script("""
        const link = document.querySelector('link[rel=icon]');
        return Promise.all([link.href, '/favicon.ico'].map((u) => fetch(u).then((r) => [r.status, r.headers.get('content-type')])));""")
    assert icons == [[200, "image/svg+xml"], [200, "image/svg+xml"]], icons


def picker_without_herald_ops(c):
    """Herald's own tenant is not among the admin's tenants."""
    options = [o.text for o in c.d.find_elements(By.CSS_SELECTOR, "#tenant-picker option")]
    assert options == ["acme", "globex"], options


def console_mode(c, cfg):
    c.item("24-root-and-favicon", root_and_favicon)
    c.sign_in(cfg["admin_token"], cfg["tenant"])
    c.find("main > #page-overview")
    c.item("23-picker-without-herald-ops", picker_without_herald_ops)
    out = lifecycle(c, cfg, "console")
    c.item("24-console-narrow", narrow, cfg, "console")
    c.item("24-console-queue-targets", queue_targets, cfg)
    c.item("24-console-replays", replays_shown, cfg)
    c.shot("console-replays-with-filters", "main table")
    c.item("24-console-dates", dates_as_utc, cfg)
    return out


class Shots(Portal):
    """The portal, saving its screenshots in its own directory."""

    def __init__(self, driver, cfg):
        super().__init__(driver, {**cfg, "screenshots": cfg["screenshots"]["portal"]})


def portal_mode(p, cfg):
    p.open_link(p.mint())
    out = lifecycle(p, cfg, "portal")
    p.item("24-portal-narrow", narrow, cfg, "portal")
    p.item("24-portal-queue-targets", queue_targets, cfg)
    p.item("24-portal-dates", dates_as_utc, cfg)
    p.item("24-portal-replays-in-a-narrow-frame", framed_replays, cfg)
    return out


def framed_replays(p, cfg):
    """The portal in a platform's 720 px frame: the replays list whole, with its filters."""
    link = p.mint()
    p.d.get(cfg["host"] + "#" + quote(p.base + link["url"], safe=""))
    p.wait.until(lambda d: d.find_element(By.ID, "portal"))
    p.d.switch_to.frame("portal")
    try:
        p.find("main > #page-endpoints")
        replays_shown(p, cfg)
    finally:
        p.d.switch_to.default_content()
    p.shot("portal-replays-in-a-narrow-frame")


def flow(cfg):
    shots = cfg["screenshots"]
    c = Console(browser(), cfg["base"], shots["console"])
    c.cfg = cfg
    c.admin = lambda method, path, body=None: Portal.admin(c, method, path, body)
    out = {"console": run(c, lambda: console_mode(c, cfg))}
    p = Shots(browser(), cfg)
    out["portal"] = run(p, lambda: portal_mode(p, cfg))
    print(json.dumps(out))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        flow(json.load(f))
