// Overview (admin): tenants, queue depth, dead letters, endpoints by state, delivery rate.
import { api, saveSession, session } from './api.js';
import { rateChart } from './chart.js';
import { h, table, when, put } from './dom.js';

function card(label, value) {
  return h('div', { class: 'card' }, h('div', { class: 'value' }, value), h('div', { class: 'label' }, label));
}

export async function overviewPage(main, rerender) {
  const [o, tenants] = await Promise.all([api('GET', '/v1/overview'), api('GET', '/v1/tenants')]);
  const states = o.endpoints_by_state;
  const lastMinute = o.series.points.at(-1)?.attempts ?? 0;
  put(main,
    h('h1', {}, 'Overview'),
    h('div', { class: 'cards', id: 'overview-cards' },
      card('Tenants', o.tenants),
      card('Due deliveries (queue depth)', o.due),
      card('Oldest due since', when(o.oldest_due_at)),
      card('Attempts in the last minute', lastMinute),
      card('Dead letters', o.dead_letters),
      card('Endpoints active', states.active ?? 0),
      card('Endpoints paused', states.paused ?? 0),
      card('Endpoints disabled', states.disabled ?? 0)),
    h('section', {}, h('h2', {}, 'Delivery rate and latency, last hour'), rateChart('Every tenant, last hour', o.series)),
    h('section', {}, h('h2', {}, 'Tenants'),
      table('Tenants and their dead letters', [
        { label: 'Tenant', cell: (t) => t.id },
        { label: 'Name', cell: (t) => t.name },
        { label: 'Dead letters', num: true, cell: (t) => o.dead_letters_by_tenant[t.id] ?? 0 },
        { label: 'Created', cell: (t) => when(t.created_at) },
        { label: '', cell: (t) => h('button', { type: 'button', class: 'secondary', onclick: () => {
          saveSession({ ...session(), tenant: t.id });
          location.hash = '#/endpoints';
          rerender();
        } }, `Open ${t.id}`) },
      ], tenants.data, 'No tenants yet.')));
}
