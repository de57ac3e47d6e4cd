// Plugins: the tenant's plugins with hooks, version, size, load error, how their calls went
// (calls, failures, p50/p99) and which endpoints bind each; one plugin's page with its
// failures by reason and its latest failures (message and log lines); an upload that shows
// why a file was refused (for a token that may manage plugins).
import { api, can, tenantPath } from './api.js';
import { facts, field, guard, h, link, needs, say, table, when, put } from './dom.js';

const pluginPath = (name) => tenantPath(`/plugins/${encodeURIComponent(name)}`);

function ms(x) {
  return x === null || x === undefined ? '—' : `${x < 10 ? x.toFixed(2) : x.toFixed(0)} ms`;
}

/** `reason: n` for each kind of failure. */
function reasons(stats) {
  const entries = Object.entries(stats.failures_by_reason);
  return entries.length ? entries.map(([r, n]) => `${r}: ${n}`).join(', ') : '—';
}

/** A page of the endpoints that bind `name` to a hook (pinned `name@n` too), found by the server. */
function boundBy(name, limit, after) {
  return api('GET', tenantPath('/endpoints'), { query: { plugin: name, limit, after } });
}

/** The first few endpoints binding a plugin, and whether there are more. */
function boundCell(page) {
  if (page.data.length === 0) return '—';
  const ids = page.data.map((e) => e.id).join(', ');
  return page.next_after ? `${ids}, and more` : ids;
}

export async function pluginsPage(main, rerender, name, params) {
  if (name) return pluginPage(main, name, params);
  const plugins = await api('GET', tenantPath('/plugins'));
  const details = await Promise.all(plugins.data.map(async (p) => {
    const [detail, bound] = await Promise.all([api('GET', pluginPath(p.name)), boundBy(p.name, 5)]);
    return { ...detail, bound };
  }));
  const file = h('input', { name: 'file', type: 'file', required: true, accept: '.wasm,.js,application/wasm' });
  const nameInput = h('input', { name: 'name', required: true, pattern: '[a-z0-9_\\-]{1,64}', placeholder: 'classify-409' });
  const result = h('p', { id: 'upload-result', 'aria-live': 'polite' });
  put(main, h('h1', {}, 'Plugins'),
    table('The tenant\u2019s plugins, with their calls since this node started', [
      { label: 'Name', cell: (p) => link(`#/plugins/${encodeURIComponent(p.name)}`, p.name) },
      { label: 'Hooks', cell: (p) => p.hooks.join(', ') || '—' },
      { label: 'Version', cell: (p) => (p.plugin_version ? `${p.plugin_name} ${p.plugin_version}` : '—') },
      { label: 'Size', num: true, cell: (p) => `${(p.size / 1024).toFixed(1)} KiB` },
      { label: 'Loaded', cell: (p) => (p.loading ? 'loading…' : when(p.loaded_at)) },
      { label: 'Load error', cls: 'url', cell: (p) => p.error ?? '—' },
      { label: 'Calls', num: true, cell: (p) => p.stats.calls },
      { label: 'Failures', num: true, cell: (p) => p.stats.failures },
      { label: 'By reason', cell: (p) => reasons(p.stats) },
      { label: 'p50', num: true, cell: (p) => ms(p.stats.p50_ms) },
      { label: 'p99', num: true, cell: (p) => ms(p.stats.p99_ms) },
      { label: 'Latest failure', cls: 'url', cell: (p) => p.stats.recent_failures[0]?.message ?? '—' },
      { label: 'Bound by', cls: 'url', cell: (p) => boundCell(p.bound) },
    ], details, 'This tenant has no plugins.'),
    h('section', { id: 'upload' }, h('h2', {}, 'Upload a plugin'),
      !can('manage') ? needs('manage-needed', 'Uploading a plugin', 'manage') :
      h('form', { class: 'inline', 'aria-label': 'Upload a plugin', onsubmit: (ev) => {
        ev.preventDefault();
        result.textContent = '';
        guard(async () => {
          const bytes = await file.files[0].arrayBuffer();
          try {
            await api('PUT', pluginPath(nameInput.value), { raw: bytes });
          } catch (e) {
            result.textContent = `Refused: ${e.message}`;
            throw e;
          }
          say(`Plugin ${nameInput.value} uploaded.`);
          rerender();
        });
      } }, field('Name', nameInput), field('WebAssembly component (.wasm) or JavaScript (.js)', file), h('button', { type: 'submit' }, 'Upload')),
      result));
}

/** One plugin: what serves, how its calls went per hook, its latest failures, and a page
 *  of the endpoints that bind it. */
async function pluginPage(main, name, params) {
  const [p, bound] = await Promise.all([api('GET', pluginPath(name)), boundBy(name, 50, params.get('after'))]);
  const s = p.stats;
  const next = bound.next_after ? `#/plugins/${encodeURIComponent(name)}?after=${encodeURIComponent(bound.next_after)}` : null;
  put(main, h('h1', {}, 'Plugin ', p.name),
    facts([
      ['Hooks', p.hooks.join(', ') || '—'],
      ['Version', p.plugin_version ? `${p.plugin_name} ${p.plugin_version}` : '—'],
      ['Stored version', p.version ?? '—'], ['Size', `${(p.size / 1024).toFixed(1)} KiB`],
      ['SHA-256', p.sha256 || '—'], ['Loaded', p.loading ? 'loading…' : when(p.loaded_at)],
      ['Load error', p.error ?? '—'],
      ['Calls', String(s.calls)], ['Failures', String(s.failures)], ['Failures by reason', reasons(s)],
      ['p50 / p99', `${ms(s.p50_ms)} / ${ms(s.p99_ms)}`],
    ]),
    h('section', {}, h('h2', {}, 'Calls by hook'), table('Since this node started', [
      { label: 'Hook', cell: (x) => x.hook },
      { label: 'Calls', num: true, cell: (x) => x.calls },
      { label: 'Failures', num: true, cell: (x) => x.failures },
    ], s.hooks, 'Not called yet.')),
    h('section', { id: 'recent-failures' }, h('h2', {}, 'Latest failures'),
      s.recent_failures.length === 0 ? h('p', { class: 'muted' }, 'No failure.') : s.recent_failures.map(failure)),
    h('section', { id: 'bound-by' }, h('h2', {}, 'Bound by'),
      bound.data.length === 0 ? h('p', { class: 'muted' }, 'No endpoint binds it.')
        : h('ul', {}, bound.data.map((e) => h('li', {}, link(`#/endpoints/${encodeURIComponent(e.id)}`, e.id), ` ${e.url}`))),
      next ? link(next, 'Next page') : null));
}

/** One failed call: when, which hook and why, the event it was for, and its log lines. */
function failure(f) {
  return h('article', { class: 'failure' },
    h('h3', {}, `${when(f.at)} · ${f.hook} · ${f.reason}`),
    h('p', { class: 'failure-message' }, f.message),
    h('p', { class: 'muted' }, 'Event ', link(`#/deliveries?event=${encodeURIComponent(f.event_id)}`, f.event_id), `, attempt ${f.attempt_id}`),
    f.logs.length === 0 ? h('p', { class: 'muted' }, 'No log lines.')
      : h('pre', { class: 'failure-logs' }, f.logs.map((l) => `${l.level}: ${l.message}`).join('\n')));
}
