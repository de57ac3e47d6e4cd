// The console's shell: sign-in, the page list and hash routing (#/page/id?filters). As the
// customer portal (`/console/portal`), it signs in from the link's one-time code instead,
// shows the tenant's branding and none of the operator's pages.
import { ApiError, api, clearSession, inPortal, saveSession, session } from './api.js';
import { auditPage } from './audit.js';
import { catalogPage } from './catalog.js';
import { deadLettersPage } from './deadletters.js';
import { deliveriesPage, deliveryPage } from './deliveries.js';
import { field, guard, h, newsAfterNavigation, problem, put, say, sayAcross } from './dom.js';
import { endpointPage, endpointsPage } from './endpoints.js';
import { overviewPage } from './overview.js';
import { pluginsPage } from './plugins.js';

const PAGES = [
  { id: 'overview', label: 'Overview', admin: true },
  { id: 'endpoints', label: 'Endpoints' },
  { id: 'catalog', label: 'Event catalog' },
  { id: 'deliveries', label: 'Deliveries' },
  { id: 'dead-letters', label: 'Dead letters' },
  { id: 'plugins', label: 'Plugins', plugins: true },
  { id: 'audit', label: 'Audit log' },
];

/** Whether session `s` shows `page`: the overview to the admin only; plugins not in the
 *  portal unless the operator allows them. */
function shows(s, page) {
  if (page.admin && !s.admin) return false;
  return !(page.plugins && s.portal && !s.portal.plugins);
}

const main = () => document.getElementById('main');

/** Signs in: the API says whose the token is and its scopes (the pages offer only what
 *  those allow); the admin opens `tenant` or the first tenant, a tenant token its own. */
async function signIn(token, tenant) {
  const me = await api('GET', '/v1/whoami', { token });
  if (me.admin) {
    const tenants = await api('GET', '/v1/tenants', { token });
    return { token, admin: true, scopes: me.scopes, tenant: tenant || tenants.data[0]?.id || '' };
  }
  // As the API answers for another tenant's objects.
  if (tenant && tenant !== me.tenant) throw new ApiError(404, 'not_found', `tenant ${tenant} not found for this token`);
  return { token, admin: false, scopes: me.scopes, tenant: me.tenant, portal: me.portal };
}

/** The portal's sign-in: the link's fragment holds a one-time code. It leaves the URL
 *  (and this history entry) before anything else, then is exchanged for the session's
 *  token, which stays in this tab's session storage only. */
async function portalSignIn() {
  const code = new URLSearchParams(location.hash.replace(/^#/, '')).get('code');
  if (!code) return;
  history.replaceState(null, '', location.pathname);
  clearSession();
  const { token } = await api('POST', '/v1/portal-sessions/exchange', { body: { code }, token: '' });
  saveSession(await signIn(token, ''));
}

/** The tenant's branding: a name as text, a logo as an image source, an accent colour as
 *  a CSS custom property (nothing of it is ever markup). */
async function brand() {
  // Kept with the session: a page refused after expiry still shows whose portal it is.
  const b = await api('GET', tenantPathOf(session().tenant, '/branding')).catch(() => session().brand);
  const el = document.querySelector('.brand');
  if (!b) return;
  saveSession({ ...session(), brand: b });
  const logo = b.logo ? h('img', { src: b.logo, alt: '', class: 'logo' }) : null;
  el.replaceChildren(...[logo, b.name].filter(Boolean));
  if (b.accent) document.documentElement.style.setProperty('--accent', b.accent);
  document.title = b.name;
}

function tenantPathOf(tenant, rest) {
  return `/v1/tenants/${encodeURIComponent(tenant)}${rest}`;
}

/** The session with the token's scopes, asked again if it was saved without them. */
async function withScopes(s) {
  if (Array.isArray(s.scopes)) return s;
  const me = await api('GET', '/v1/whoami');
  saveSession({ ...s, scopes: me.scopes });
  return session();
}

/** Moves to `hash` and renders once: a changed hash renders through `hashchange`. */
function go(hash) {
  if (location.hash === hash) {
    newsAfterNavigation(); // already said, and no navigation will take it
    return render();
  }
  location.hash = hash;
  return undefined;
}

function signInForm() {
  const token = h('input', { name: 'token', type: 'password', required: true, autocomplete: 'off' });
  const tenant = h('input', { name: 'tenant', autocomplete: 'off', placeholder: 'acme' });
  return h('form', { class: 'signin', 'aria-label': 'Sign in', onsubmit: (ev) => {
    ev.preventDefault();
    guard(async () => {
      saveSession(await signIn(token.value.trim(), tenant.value.trim()));
      sayAcross('Signed in.');
      await go(session().admin ? '#/overview' : '#/endpoints');
    });
  } }, h('h1', {}, 'Sign in to Herald'),
  h('p', { class: 'muted' }, 'The admin token sees every tenant; a tenant token sees its own tenant, as far as its scopes allow. ' +
    'The token stays in this browser tab\u2019s session storage.'),
  field('API token', token), field('Tenant (optional: the admin\u2019s first; a tenant token\u2019s own)', tenant),
  h('button', { type: 'submit' }, 'Sign in'));
}

/** The admin's tenants. The list leaves out Herald's own `herald-ops`; signed in to it by
 *  name (its operational events' deliveries), the picker names it too. */
async function tenantPicker(s) {
  const tenants = await api('GET', '/v1/tenants').catch(() => ({ data: [] }));
  const ids = tenants.data.map((t) => t.id);
  if (s.tenant && !ids.includes(s.tenant)) ids.unshift(s.tenant);
  return h('select', { id: 'tenant-picker', 'aria-label': 'Tenant', onchange: (ev) => {
    saveSession({ ...session(), tenant: ev.target.value });
    render();
  } }, ids.map((id) => h('option', { value: id, selected: id === s.tenant }, id)));
}

/** The header for `page`, once what it shows has been read: a function that draws it,
 *  replacing the previous one whole (two renders under way must not both add to it). */
async function header(s, page) {
  const picker = s.admin ? await tenantPicker(s) : null;
  const links = PAGES.filter((p) => shows(s, p)).map((p) =>
    h('a', { href: `#/${p.id}`, 'aria-current': p.id === page ? 'page' : null }, p.label));
  const whoText = s.portal ? `${s.portal.read_only ? 'read only' : s.scopes.join(', ')}`
    : s.admin ? 'admin' : `tenant ${s.tenant} (${s.scopes.join(', ')})`;
  const who = [h('span', {}, whoText), picker,
    s.portal ? null : h('button', { type: 'button', class: 'secondary', onclick: () => {
      clearSession();
      sayAcross('Signed out.');
      go('');
    } }, 'Sign out')];
  return () => {
    const nav = document.getElementById('nav');
    nav.hidden = false;
    nav.replaceChildren(...links);
    document.getElementById('who').replaceChildren(...who.filter(Boolean));
  };
}

function route() {
  const [path, query] = location.hash.replace(/^#\/?/, '').split('?');
  const [page, id] = path.split('/').map(decodeURIComponent);
  return { page: page || '', id, params: new URLSearchParams(query ?? '') };
}

let generation = 0;

async function render() {
  const mine = ++generation;
  let s = session();
  const m = main();
  if (!s?.token) {
    document.getElementById('nav').hidden = true;
    document.getElementById('who').replaceChildren();
    m.replaceChildren(inPortal() ? h('p', { id: 'portal-signin', role: 'alert' },
      'Open this portal from the link your provider gives you.') : signInForm());
    return;
  }
  let { page, id, params } = route();
  if (!PAGES.some((p) => p.id === page && shows(s, p))) page = s.admin ? 'overview' : 'endpoints';
  s = await guard(() => withScopes(s));
  if (!s) return;
  const draw = await header(s, page);
  // A later navigation has started its own render: it draws the header.
  if (mine !== generation) return;
  draw();
  // `data-route`: which navigation this page answers (tests wait for it).
  const content = h('div', { id: `page-${page}`, 'data-route': location.hash });
  const rerender = () => render();
  const pages = {
    overview: () => overviewPage(content, rerender),
    endpoints: () => (id ? endpointPage(content, id, rerender) : endpointsPage(content, params)),
    deliveries: () => (id ? deliveryPage(content, id) : deliveriesPage(content, params)),
    catalog: () => catalogPage(content, id),
    'dead-letters': () => deadLettersPage(content, params),
    plugins: () => pluginsPage(content, rerender, id, params),
    audit: () => auditPage(content, params),
  };
  m.setAttribute('aria-busy', 'true');
  try {
    await pages[page]();
  } catch (e) {
    // Said where it happened: what the page drew before it (heading, search form) stays.
    put(content, problem(e));
  }
  // A later navigation has started its own render: this one's page is stale.
  if (mine !== generation) return;
  m.replaceChildren(content);
  m.setAttribute('aria-busy', 'false');
  const label = PAGES.find((p) => p.id === page).label;
  document.title = s.portal ? `${document.querySelector('.brand').textContent} · ${label}` : `Herald · ${label}`;
}

window.addEventListener('hashchange', () => {
  say(newsAfterNavigation());
  render().then(() => main().focus());
});

async function start() {
  if (inPortal()) {
    document.body.classList.add('portal');
    try {
      await portalSignIn();
    } catch (e) {
      document.getElementById('nav').hidden = true;
      main().replaceChildren(problem(e));
      return;
    }
    if (session()?.token) await brand();
  }
  await render();
}
start();
