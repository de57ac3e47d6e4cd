// The event catalog: the types a tenant's endpoints may subscribe to (its own and the
// operator's), each with its description, its JSON Schema versions and its examples. Read
// only: the catalog is written through the API by the platform, not from this page.
import { api, tenantPath } from './api.js';
import { facts, h, link, put, table, when } from './dom.js';

export async function catalogPage(main, name) {
  if (name) return typePage(main, name);
  const types = await api('GET', tenantPath('/event-types'));
  return put(main, h('h1', {}, 'Event catalog'),
    h('p', { class: 'muted' }, 'The events your endpoints can subscribe to, with the shape of each.'),
    table('Event types', [
      { label: 'Type', cell: (t) => link(`#/catalog/${encodeURIComponent(t.name)}`, t.name) },
      { label: 'Description', cls: 'url', cell: (t) => t.description || '—' },
      { label: 'Schema version', num: true, cell: (t) => (t.version ? String(t.version) : '—') },
      { label: 'Examples', num: true, cell: (t) => String(t.examples.length) },
      { label: 'Deprecated', cell: (t) => (t.deprecated ? 'deprecated' : '') },
    ], types.data, 'The catalog has no event types yet.'));
}

async function typePage(main, name) {
  const path = tenantPath(`/event-types/${encodeURIComponent(name)}`);
  put(main, h('p', {}, link('#/catalog', 'All event types')), h('h1', {}, 'Event type ', name));
  const [t, versions] = await Promise.all([api('GET', path), api('GET', `${path}/versions`).catch(() => ({ data: [] }))]);
  return put(main,
    facts([['Description', t.description || '—'], ['Deprecated', t.deprecated ? 'yes' : 'no'],
      ['From', t.source], ['Updated', when(t.updated_at)]]),
    h('section', { id: 'examples' }, h('h2', {}, 'Examples'),
      t.examples.length ? t.examples.map((x, i) => [h('h3', {}, `Example ${i}`), h('pre', {}, JSON.stringify(x, null, 2))])
        : h('p', { class: 'muted' }, 'No examples.')),
    h('section', { id: 'schemas' }, h('h2', {}, 'Schema versions'),
      versions.data.length ? versions.data.slice().reverse().map((v) =>
        [h('h3', {}, `Version ${v.version} (${when(v.created_at)})`), h('pre', {}, JSON.stringify(v.schema, null, 2))])
        : h('p', { class: 'muted' }, 'No schema: any JSON payload.')));
}
