// Builds the page. Every value from the API becomes a text node (textContent): nothing the
// store holds is ever parsed as HTML, so a hostile description or response body is text.

/** An element with attributes (`on…` are listeners) and children (nodes or text). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** A table: `columns` are `{label, cell: row => node or text, num}`. It scrolls sideways
 *  in its own box when it is wider than the page (a narrow window, a frame), so the page
 *  itself never does. */
export function table(caption, columns, rows, empty = 'Nothing to show.') {
  if (rows.length === 0) return h('p', { class: 'muted' }, empty);
  return h('div', { class: 'table-wrap' }, h('table', {},
    h('caption', { class: 'muted' }, caption),
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.num ? 'num' : c.cls }, c.label)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, columns.map((c) => h('td', { class: c.num ? 'num' : c.cls }, c.cell(r))))))));
}

/** A labelled form control. */
export function field(label, control) {
  return h('label', {}, label, control);
}

/** `<dl>` of [term, value] pairs; a null in place of a pair is left out. */
export function facts(pairs) {
  return h('dl', { class: 'grid' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '—')]));
}

export function when(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function percent(x) {
  return x === null || x === undefined ? '—' : `${(x * 100).toFixed(1)} %`;
}

export function stateText(s, reason, until) {
  let text = s;
  if (until) text += ` until ${when(until)}`;
  if (reason) text += ` (${reason})`;
  return h('span', { class: `state-${s}` }, text);
}

/** An endpoint's `delivery_status` as a short badge: its status, and until when a timed
 *  pause runs; since when and why in its title. */
export function statusBadge(ds) {
  let text = ds.status;
  if (ds.until) text += ` until ${when(ds.until)}`;
  const title = [ds.since ? `since ${when(ds.since)}` : null, ds.reason].filter(Boolean).join('; ');
  return h('span', { class: `state-${ds.status}`, title }, text);
}

/** An endpoint's `delivery_status` in full: status, since, until, why. */
export function statusText(ds) {
  let text = ds.status;
  if (ds.since) text += ` since ${when(ds.since)}`;
  if (ds.until) text += `, until ${when(ds.until)}`;
  if (ds.reason) text += ` (${ds.reason})`;
  return h('span', { class: `state-${ds.status}` }, text);
}

/** An endpoint's latest failed attempt: its category, HTTP status and time. */
export function lastErrorText(le) {
  if (!le) return 'none';
  return `${le.category}${le.status ? ` (HTTP ${le.status})` : ''} at ${when(le.at)}`;
}

/** Shows `message` in the alert region (errors) or the status region (news). */
export function say(message, isError = false) {
  document.getElementById(isError ? 'alert' : 'status').textContent = message;
  document.getElementById(isError ? 'status' : 'alert').textContent = '';
}

/** News said before a navigation that the next page keeps showing (a navigation clears
 *  the regions otherwise): "Endpoint … added." then its page. */
let afterNavigation = '';

export function sayAcross(message) {
  afterNavigation = message;
  say(message);
}

/** What the page after a navigation says: the news said for it, once, or nothing. */
export function newsAfterNavigation() {
  const message = afterNavigation;
  afterNavigation = '';
  return message;
}

/** A secret shown whole in a read-only field with a Copy button: selected on focus, so it
 *  can be copied by hand too (a frame may not allow the clipboard). */
export function copyable(id, label, value) {
  const input = h('input', { id, readonly: true, value, 'aria-label': label, spellcheck: 'false', onfocus: (ev) => ev.target.select() });
  const said = h('span', { class: 'muted', 'aria-live': 'polite' });
  const copy = async () => {
    input.focus();
    input.select();
    let ok = false;
    try {
      await navigator.clipboard.writeText(value);
      ok = true;
    } catch {
      ok = document.execCommand('copy');
    }
    said.textContent = ok ? 'Copied.' : 'Selected: copy it with Ctrl+C (or \u2318C).';
  };
  return h('div', { class: 'copyable' }, input, h('button', { type: 'button', class: 'secondary', onclick: copy }, 'Copy'), said);
}

/** An error said inside the page, where it happened (the rest of the page stays):
 *  `subject` (what was looked for), then the refusal's code and message. */
export function problem(e, subject) {
  const text = e?.message || String(e);
  return h('p', { class: 'problem', role: 'alert' }, subject ? `${subject}: ${text}` : text);
}

/** In place of an action the token's scopes do not allow: what it would need. */
export function needs(id, what, scope) {
  return h('p', { id, class: 'muted needs' }, `${what} needs a token with the ${scope} scope.`);
}

/** Runs `f`, showing an API refusal as the page's alert rather than losing it. */
export async function guard(f) {
  try {
    return await f();
  } catch (e) {
    say(e.message || String(e), true);
    return undefined;
  }
}

/** A link to a page of the console. */
export function link(hash, text) {
  return h('a', { href: hash }, text);
}

/** Appends `children` to `el` as `h` does: null and false are left out, text is text. */
export function put(el, ...children) {
  append(el, children);
  return el;
}
