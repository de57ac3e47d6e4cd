// The audit log: who changed what of the tenant through the API, newest first, filtered by
// actor, kind, resource and time. Field names only: the log never holds a value. In the
// portal, the API answers with the session's endpoints' entries only (no kind to choose).
import { api, inPortal, tenantPath } from './api.js';
import { utc } from './deliveries.js';
import { field, h, link, put, table, when } from './dom.js';

const ALL_FILTERS = [['actor', 'Actor', 'token:tok_…'], ['kind', 'Kind', 'endpoint'], ['resource', 'Resource id', 'ep_…'],
  ['since', 'Since (UTC)', 'YYYY-MM-DD hh:mm'], ['until', 'Until (UTC)', 'YYYY-MM-DD hh:mm']];

export async function auditPage(main, params) {
  const FILTERS = ALL_FILTERS.filter(([n]) => !(n === 'kind' && inPortal()));
  const q = Object.fromEntries(FILTERS.map(([n]) => [n, params.get(n)]));
  const page = await api('GET', tenantPath('/audit'),
    { query: { ...q, since: utc(q.since), until: utc(q.until), after: params.get('after'), limit: 50 } });
  const inputs = FILTERS.map(([n, , hint]) => h('input', { name: n, value: params.get(n) ?? '', placeholder: hint }));
  const form = h('form', { class: 'inline', role: 'search', 'aria-label': 'Filter audit', onsubmit: (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const el of inputs) if (el.value) next.set(el.name, el.value);
    location.hash = `#/audit?${next}`;
  } }, FILTERS.map(([, label], i) => field(label, inputs[i])), h('button', { type: 'submit' }, 'Filter'));
  const next = new URLSearchParams(params);
  if (page.next_after) next.set('after', page.next_after);
  return put(main, h('h1', {}, 'Audit log'), form,
    table('Changes through the API, newest first', [
      { label: 'When', cell: (e) => when(e.at) },
      { label: 'Actor', cell: (e) => e.actor },
      { label: 'Route', cls: 'wrap', cell: (e) => e.route },
      { label: 'Resource', cell: (e) => `${e.kind}${e.resource ? ` ${e.resource}` : ''}` },
      { label: 'Fields set', cls: 'wrap', cell: (e) => e.fields.join(', ') },
      { label: 'Client', cell: (e) => e.client ?? '' },
    ], page.data, 'No change matches.'),
    page.next_after ? link(`#/audit?${next}`, 'Next page') : null);
}
