// The console's shell: sign-in, the page list and hash routing (#/page/id?filters).
import { ApiError, api, clearSession, saveSession, session } from './api.js';
import { deadLettersPage } from './deadletters.js';
import { deliveriesPage, deliveryPage } from './deliveries.js';
import { field, guard, h, put, say } from './dom.js';
import { endpointPage, endpointsPage } from './endpoints.js';
import { overviewPage } from './overview.js';
import { pluginsPage } from './plugins.js';

const PAGES = [
  { id: 'overview', label: 'Overview', admin: true },
  { id: 'endpoints', label: 'Endpoints' },
  { id: 'deliveries', label: 'Deliveries' },
  { id: 'dead-letters', label: 'Dead letters' },
  { id: 'plugins', label: 'Plugins' },
];

const main = () => document.getElementById('main');

/** Signs in: the admin token reads the tenant list; a tenant token must reach its tenant. */
async function signIn(token, tenant) {
  try {
    const tenants = await api('GET', '/v1/tenants', { token });
    return { token, admin: true, tenant: tenant || tenants.data[0]?.id || '' };
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 403) throw e;
  }
  if (!tenant) throw new Error('A tenant token needs its tenant id.');
  await api('GET', `/v1/tenants/${encodeURIComponent(tenant)}/endpoints`, { token, query: { limit: 1 } });
  return { token, admin: false, tenant };
}

function signInForm() {
  const token = h('input', { name: 'token', type: 'password', required: true, autocomplete: 'off' });
  const tenant = h('input', { name: 'tenant', autocomplete: 'off', placeholder: 'acme' });
  return h('form', { class: 'signin', 'aria-label': 'Sign in', onsubmit: (ev) => {
    ev.preventDefault();
    guard(async () => {
      saveSession(await signIn(token.value.trim(), tenant.value.trim()));
      say('Signed in.');
      location.hash = session().admin ? '#/overview' : '#/endpoints';
      await render();
    });
  } }, h('h1', {}, 'Sign in to Herald'),
  h('p', { class: 'muted' }, 'The admin token sees every tenant; a tenant token sees its own tenant, as far as its scopes allow. ' +
    'The token stays in this browser tab\u2019s session storage.'),
  field('API token', token), field('Tenant (needed for a tenant token)', tenant), h('button', { type: 'submit' }, 'Sign in'));
}

async function tenantPicker(s) {
  const tenants = await api('GET', '/v1/tenants').catch(() => ({ data: [] }));
  return h('select', { id: 'tenant-picker', 'aria-label': 'Tenant', onchange: (ev) => {
    saveSession({ ...session(), tenant: ev.target.value });
    render();
  } }, tenants.data.map((t) => h('option', { value: t.id, selected: t.id === s.tenant }, t.id)));
}

async function header(s, page) {
  const nav = document.getElementById('nav');
  nav.hidden = false;
  nav.replaceChildren(...PAGES.filter((p) => s.admin || !p.admin).map((p) =>
    h('a', { href: `#/${p.id}`, 'aria-current': p.id === page ? 'page' : null }, p.label)));
  const who = document.getElementById('who');
  who.replaceChildren();
  put(who, h('span', {}, s.admin ? 'admin' : `tenant ${s.tenant}`),
    s.admin ? await tenantPicker(s) : null,
    h('button', { type: 'button', class: 'secondary', onclick: () => {
      clearSession();
      location.hash = '';
      say('Signed out.');
      render();
    } }, 'Sign out'));
}

function route() {
  const [path, query] = location.hash.replace(/^#\/?/, '').split('?');
  const [page, id] = path.split('/').map(decodeURIComponent);
  return { page: page || '', id, params: new URLSearchParams(query ?? '') };
}

let generation = 0;

async function render() {
  const mine = ++generation;
  const s = session();
  const m = main();
  if (!s?.token) {
    document.getElementById('nav').hidden = true;
    document.getElementById('who').replaceChildren();
    m.replaceChildren(signInForm());
    return;
  }
  let { page, id, params } = route();
  if (!PAGES.some((p) => p.id === page && (s.admin || !p.admin))) page = s.admin ? 'overview' : 'endpoints';
  await header(s, page);
  // `data-route`: which navigation this page answers (tests wait for it).
  const content = h('div', { id: `page-${page}`, 'data-route': location.hash });
  const rerender = () => render();
  const pages = {
    overview: () => overviewPage(content, rerender),
    endpoints: () => (id ? endpointPage(content, id, rerender) : endpointsPage(content, params)),
    deliveries: () => (id ? deliveryPage(content, id) : deliveriesPage(content, params)),
    'dead-letters': () => deadLettersPage(content, params),
    plugins: () => pluginsPage(content, rerender, id, params),
  };
  m.setAttribute('aria-busy', 'true');
  await guard(pages[page]);
  // A later navigation has started its own render: this one's page is stale.
  if (mine !== generation) return;
  m.replaceChildren(content);
  m.setAttribute('aria-busy', 'false');
  document.title = `Herald · ${PAGES.find((p) => p.id === page).label}`;
}

window.addEventListener('hashchange', () => {
  say('');
  render().then(() => main().focus());
});
render();
