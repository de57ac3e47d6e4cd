// Deliveries: search by event id, endpoint, state, type and time window (newest first);
// one delivery with every attempt and the exact request each sent.
import { api, tenantPath } from './api.js';
import { facts, field, h, link, problem, stateText, table, when, put } from './dom.js';

const STATES = ['', 'queued', 'delivering', 'waiting', 'delivered', 'dead', 'paused'];
const FILTERS = ['event', 'endpoint', 'state', 'type', 'since', 'until'];

/** A time as the search form takes it, in UTC: `2026-12-07`, `2026-12-07 09:30`, with
 *  seconds, with `T` for the space, with a trailing `Z`. (A browser's date picker shows
 *  its locale's order, `mm/dd/yyyy`, whatever time zone the label says.) */
const UTC_TIME = '\\d{4}-\\d{2}-\\d{2}([ T]\\d{2}:\\d{2}(:\\d{2})?)?Z?';

/** The RFC 3339 time of a search form's time (taken as UTC), or undefined. */
export function utc(v) {
  if (!v) return undefined;
  const [date, time = '00:00'] = v.trim().replace(/Z$/, '').split(/[ T]/);
  return `${date}T${time.length === 5 ? `${time}:00` : time}Z`;
}

function timeInput(name, params) {
  return h('input', { name, value: params.get(name) ?? '', pattern: UTC_TIME, placeholder: 'YYYY-MM-DD hh:mm',
    title: 'A UTC time: YYYY-MM-DD, optionally with hh:mm or hh:mm:ss', autocomplete: 'off' });
}

/** A search form whose fields mirror `params`; submitting moves to `#/{page}?…`. */
export function searchForm(page, params, names, extra = {}) {
  const inputs = {};
  const make = {
    event: () => h('input', { name: 'event', value: params.get('event') ?? '', placeholder: 'evt_…' }),
    endpoint: () => h('input', { name: 'endpoint', value: params.get('endpoint') ?? '', placeholder: 'ep_…' }),
    state: () => h('select', { name: 'state' }, STATES.map((s) => h('option', { value: s, selected: params.get('state') === s }, s || 'any'))),
    type: () => h('input', { name: 'type', value: params.get('type') ?? '', placeholder: 'invoice.paid' }),
    reason: () => h('input', { name: 'reason', value: params.get('reason') ?? '', placeholder: 'exhausted' }),
    since: () => timeInput('since', params),
    until: () => timeInput('until', params),
  };
  const labels = { event: 'Event id', endpoint: 'Endpoint id', state: 'State', type: 'Event type', reason: 'Reason', since: 'Since (UTC)', until: 'Until (UTC)' };
  for (const n of names) inputs[n] = make[n]();
  return h('form', { class: 'inline', role: 'search', 'aria-label': `Filter ${page}`, onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [n, el] of Object.entries(inputs)) if (el.value) q.set(n, el.value);
    location.hash = `#/${page}?${q}`;
  } }, names.map((n) => field(labels[n], inputs[n])), h('button', { type: 'submit' }, extra.button ?? 'Search'));
}

export async function deliveriesPage(main, params) {
  const q = {
    endpoint: params.get('endpoint'), state: params.get('state'), type: params.get('type'),
    since: utc(params.get('since')), until: utc(params.get('until')), after: params.get('after'), limit: 50,
  };
  const event = params.get('event');
  // The search stays whatever the search finds: an unknown event is said under it.
  put(main, h('h1', {}, 'Deliveries'), searchForm('deliveries', params, FILTERS));
  let page;
  try {
    page = event
      ? await api('GET', tenantPath(`/events/${encodeURIComponent(event)}/deliveries`), { query: q })
      : await api('GET', tenantPath('/deliveries'), { query: { ...q, order: 'desc' } });
  } catch (e) {
    put(main, problem(e, event && `Event ${event}`));
    return;
  }
  const next = new URLSearchParams(params);
  if (page.next_after) next.set('after', page.next_after);
  put(main,
    table(event ? `Deliveries of event ${event}` : 'Deliveries, newest first', [
      { label: 'Delivery', cell: (d) => link(`#/deliveries/${encodeURIComponent(d.id)}`, d.id) },
      { label: 'Event', cell: (d) => d.event_id },
      { label: 'Endpoint', cell: (d) => link(`#/endpoints/${encodeURIComponent(d.endpoint_id)}`, d.endpoint_id) },
      { label: 'Type', cell: (d) => d.event_type },
      { label: 'State', cell: (d) => stateText(d.state, d.reason) },
      { label: 'Attempts', num: true, cell: (d) => d.attempts },
      { label: 'Last status', num: true, cell: (d) => d.last_status ?? '—' },
      { label: 'Updated', cell: (d) => when(d.updated_at) },
    ], page.data, 'No delivery matches.'),
    page.next_after ? link(`#/deliveries?${next}`, 'Next page') : null);
}

export async function deliveryPage(main, id) {
  // Drawn first: an unknown id is said under them.
  put(main, h('p', {}, link('#/deliveries', 'All deliveries')), h('h1', {}, 'Delivery ', id));
  const d = await api('GET', tenantPath(`/deliveries/${encodeURIComponent(id)}`));
  put(main,
    facts([
      ['Event', d.event_id], ['Type', d.event_type],
      ['Endpoint', link(`#/endpoints/${encodeURIComponent(d.endpoint_id)}`, d.endpoint_id)],
      ['State', stateText(d.state, d.reason)], ['Attempts', String(d.attempts)],
      ['Next attempt', when(d.next_attempt_at)], ['Last error', d.last_error ?? '—'],
      ['Created', when(d.created_at)], ['Updated', when(d.updated_at)],
    ]),
    h('section', {}, h('h2', {}, 'Attempts'), table('Every attempt, oldest first', [
      { label: '#', num: true, cell: (a) => a.number },
      { label: 'Attempt id', cell: (a) => a.id },
      { label: 'Started', cell: (a) => when(a.started_at) },
      { label: 'Status', num: true, cell: (a) => a.status ?? '—' },
      { label: 'Duration', num: true, cell: (a) => `${a.duration_ms} ms` },
      { label: 'Verdict', cell: (a) => a.verdict },
      { label: 'Decided by', cell: (a) => a.decided_by },
      { label: 'Error', cell: (a) => a.error ?? '—' },
      { label: 'Response (first KiB)', cls: 'url', cell: (a) => (a.response_body ? h('pre', { class: 'response' }, a.response_body) : '—') },
    ], d.attempt_history, 'No attempt yet.')),
    h('section', { id: 'sent' }, h('h2', {}, 'What was sent'),
      d.attempt_history.length === 0 ? h('p', { class: 'muted' }, 'Nothing yet.') : d.attempt_history.map(sentRequest)));
}

/** One attempt's request as the receiver got it: headers in order, then the body. */
function sentRequest(a) {
  const r = a.request;
  const title = h('h3', {}, `Attempt ${a.number} `, h('span', { class: 'muted' }, a.id));
  if (!r) {
    return h('article', { class: 'sent', 'data-attempt': a.id }, title,
      h('p', { class: 'muted' }, 'Nothing was sent: a plugin decided before sending (see the error above), or the attempt was recorded before Herald kept its request.'));
  }
  const size = `${r.body_size} bytes`;
  const about = r.body_is_payload
    ? `Herald\u2019s envelope of the event\u2019s payload (${size}).`
    : `As a transform plugin made it (${size}${r.truncated ? '; the first 64 KiB shown' : ''}).`;
  return h('article', { class: 'sent', 'data-attempt': a.id }, title,
    h('h4', {}, 'Headers'),
    h('pre', { class: 'sent-headers' }, r.headers.map(([k, v]) => `${k}: ${v}`).join('\n')),
    h('h4', {}, 'Body'), h('p', { class: 'muted' }, about),
    r.body === null ? h('p', { class: 'muted' }, 'The event is no longer stored.') : h('pre', { class: 'sent-body' }, r.body));
}
