// Dead letters: counts by reason, filter, select, a rate-limited replay whose progress is
// followed live (selected, re-queued, sent, delivered, failed, back among the dead letters,
// pending), the recent replays, and cancelling one while it runs.
import { api, can, tenantPath } from './api.js';
import { searchForm, utc } from './deliveries.js';
import { field, guard, h, link, needs, say, stateText, table, when, put } from './dom.js';

let following = null;

export async function deadLettersPage(main, params) {
  const filter = {
    endpoint: params.get('endpoint'), type: params.get('type'), reason: params.get('reason'),
    since: utc(params.get('since')), until: utc(params.get('until')),
  };
  const [page, replays] = await Promise.all([
    api('GET', tenantPath('/dead-letters'), { query: { ...filter, after: params.get('after'), limit: 100 } }),
    api('GET', tenantPath('/replays'), { query: { limit: 5 } }),
  ]);
  const counts = Object.entries(page.counts_by_reason);
  const boxes = new Map();
  const rate = h('input', { name: 'rate_per_sec', type: 'number', step: 'any', min: '0.1', value: '10' });
  const progress = h('section', { id: 'replay-progress', 'aria-live': 'polite' });
  const replay = async (body) => {
    const r = await api('POST', tenantPath('/replays'), { body: { ...body, rate_per_sec: Number(rate.value) } });
    say(`Replay ${r.id} started.`);
    follow(progress, r.id);
  };
  const next = new URLSearchParams(params);
  if (page.next_after) next.set('after', page.next_after);
  const cleanFilter = Object.fromEntries(Object.entries(filter).filter(([, v]) => v));
  const replaying = can('replay');
  put(main, h('h1', {}, 'Dead letters'),
    h('section', {}, h('h2', {}, 'By reason'), counts.length === 0 ? h('p', { class: 'muted' }, 'No dead letters.') :
      h('ul', { class: 'chips', id: 'reason-counts' }, counts.map(([reason, n]) =>
        h('li', {}, link(`#/dead-letters?reason=${encodeURIComponent(reason)}`, `${reason || '(none)'}: ${n}`))))),
    searchForm('dead-letters', params, ['endpoint', 'type', 'reason', 'since', 'until'], { button: 'Filter' }),
    !replaying ? needs('replay-actions', 'Replaying dead letters', 'replay') :
    h('form', { id: 'replay-actions', class: 'inline', 'aria-label': 'Replay', onsubmit: (ev) => ev.preventDefault() },
      field('Replay rate per second', rate),
      h('button', { type: 'button', id: 'replay-selected', onclick: () => guard(() => {
        const ids = [...boxes].filter(([, b]) => b.checked).map(([id]) => id);
        if (ids.length === 0) throw new Error('Select dead letters first.');
        return replay({ ids });
      }) }, 'Replay selected'),
      h('button', { type: 'button', id: 'replay-filter', onclick: () => guard(() => replay({ filter: cleanFilter })) },
        'Replay every dead letter matching the filter')),
    progress,
    h('section', {}, h('h2', {}, 'Recent replays'), table('Recent replays, newest first', [
      // Three columns, the button under the id: the table fits a narrow frame.
      { label: 'Replay', cell: (r) => [h('div', {}, r.id), h('div', { class: 'muted' }, `${r.state}, started ${when(r.created_at)}`),
        h('button', { type: 'button', class: 'secondary', onclick: () => follow(progress, r.id) }, 'Follow')] },
      { label: 'Which dead letters', cls: 'wrap', cell: (r) => replayed(r) },
      { label: 'Progress', cls: 'wrap', cell: (r) => figuresText(r) },
    ], replays.data, 'No replay yet.')),
    table('Dead letters, oldest first', [
      replaying && { label: 'Select', cell: (d) => {
        const b = h('input', { type: 'checkbox', 'aria-label': `Select ${d.id}` });
        boxes.set(d.id, b);
        return b;
      } },
      { label: 'Delivery', cell: (d) => link(`#/deliveries/${encodeURIComponent(d.id)}`, d.id) },
      { label: 'Endpoint', cell: (d) => d.endpoint_id },
      { label: 'Type', cell: (d) => d.event_type },
      { label: 'Reason', cell: (d) => stateText('dead', d.reason) },
      { label: 'Last error', cell: (d) => d.last_error ?? '' },
      { label: 'Attempts', num: true, cell: (d) => d.attempts },
      { label: 'Dead since', cell: (d) => when(d.updated_at) },
    ].filter(Boolean), page.data, 'No dead letter matches.'),
    page.next_after ? link(`#/dead-letters?${next}`, 'Next page') : null);
  const latest = replays.data[0];
  if (latest && latest.state === 'running') follow(progress, latest.id);
}

/** Which dead letters a replay selected: each field of its filter, or how many ids. */
function replayed(r) {
  if (r.ids) return `${r.ids.length} chosen by id`;
  const f = r.filter || {};
  const parts = [['endpoint', 'endpoint'], ['type', 'type'], ['reason', 'reason']]
    .filter(([k]) => f[k]).map(([k, label]) => `${label} ${f[k]}`);
  if (f.since) parts.push(`since ${when(f.since)}`);
  if (f.until) parts.push(`until ${when(f.until)}`);
  return parts.length ? parts.join(', ') : 'every dead letter';
}

/** A replay's figures as a sentence: "selected 3, re-queued 3, …". */
function figuresText(r) {
  const text = FIGURES.map(([key, label]) => `${label.toLowerCase()} ${r[key]}`).join(', ');
  return `${text[0].toUpperCase()}${text.slice(1)}.`;
}

/** A replay's figures, in the order they happen: [field, label]. */
const FIGURES = [
  ['selected', 'Selected'], ['requeued', 'Re-queued'], ['sent', 'Sent'], ['delivered', 'Delivered'],
  ['failed', 'Failed'], ['returned', 'Back among the dead letters'], ['pending', 'Pending'],
];

/**
 * Polls the replay until everything it re-queued has settled: it is `running` until then
 * (or until it is cancelled, after which what it had sent may still be retried).
 */
function follow(section, id) {
  const me = Symbol(id);
  following = me;
  const path = tenantPath(`/replays/${encodeURIComponent(id)}`);
  const tick = async () => {
    if (following !== me || !section.isConnected) return;
    const r = await guard(() => api('GET', path));
    if (!r) return;
    const settled = r.delivered + r.failed + r.returned;
    section.replaceChildren();
    put(section, h('h2', {}, 'Replay ', r.id),
      h('p', { id: 'replay-state' }, `State: ${r.state}. ${figuresText(r)}`),
      h('p', { class: 'muted' }, `Dead letters: ${replayed(r)}.`),
      h('progress', { max: Math.max(1, r.selected), value: settled, 'aria-label': 'Replay progress' }),
      // While it runs, a cancel stops whatever it has not sent yet.
      r.state === 'running' && can('replay') ? h('button', { type: 'button', id: 'replay-cancel', class: 'secondary', onclick: () => guard(async () => {
        await api('POST', `${path}/cancel`);
        say(`Replay ${r.id} cancelled: what it had not sent is back among the dead letters.`);
      }) }, 'Cancel replay') : null);
    if (r.state !== 'running' && r.pending === 0) {
      section.append(h('p', { id: 'replay-finished' }, r.state === 'cancelled' ? 'Replay cancelled.' : 'Replay finished.'));
    } else setTimeout(tick, 500);
  };
  tick();
}
