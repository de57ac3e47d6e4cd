// Plugins: the tenant's plugins with hooks, version, size and load error, which endpoints
// bind each, and an upload that shows why a file was refused.
import { api, tenantPath } from './api.js';
import { field, guard, h, say, table, when, put } from './dom.js';

export async function pluginsPage(main, rerender) {
  const [plugins, endpoints] = await Promise.all([
    api('GET', tenantPath('/plugins')),
    api('GET', tenantPath('/endpoints'), { query: { limit: 1000 } }),
  ]);
  const usedBy = (name) => endpoints.data.filter((e) => Object.values(e.plugins).includes(name)).map((e) => e.id);
  const name = h('input', { name: 'name', required: true, pattern: '[a-z0-9_\\-]{1,64}', placeholder: 'classify-409' });
  const file = h('input', { name: 'file', type: 'file', required: true, accept: '.wasm,application/wasm' });
  const result = h('p', { id: 'upload-result', 'aria-live': 'polite' });
  put(main, h('h1', {}, 'Plugins'),
    table('The tenant\u2019s plugins', [
      { label: 'Name', cell: (p) => p.name },
      { label: 'Hooks', cell: (p) => p.hooks.join(', ') || '—' },
      { label: 'Version', cell: (p) => (p.plugin_version ? `${p.plugin_name} ${p.plugin_version}` : '—') },
      { label: 'Size', num: true, cell: (p) => `${(p.size / 1024).toFixed(1)} KiB` },
      { label: 'SHA-256', cell: (p) => (p.sha256 ? p.sha256.slice(0, 12) : '—') },
      { label: 'Loaded', cell: (p) => (p.loading ? 'loading…' : when(p.loaded_at)) },
      { label: 'Load error', cls: 'url', cell: (p) => p.error ?? '—' },
      { label: 'Bound by', cls: 'url', cell: (p) => usedBy(p.name).join(', ') || '—' },
    ], plugins.data, 'This tenant has no plugins.'),
    h('p', { class: 'muted' }, 'Per-plugin call and failure counts are in /metrics (herald_plugin_calls_total, herald_plugin_failures_total).'),
    h('section', {}, h('h2', {}, 'Upload a plugin'),
      h('form', { class: 'inline', 'aria-label': 'Upload a plugin', onsubmit: (ev) => {
        ev.preventDefault();
        result.textContent = '';
        guard(async () => {
          const bytes = await file.files[0].arrayBuffer();
          try {
            await api('PUT', tenantPath(`/plugins/${encodeURIComponent(name.value)}`), { raw: bytes });
          } catch (e) {
            result.textContent = `Refused: ${e.message}`;
            throw e;
          }
          say(`Plugin ${name.value} uploaded.`);
          rerender();
        });
      } }, field('Name', name), field('WebAssembly component (.wasm)', file), h('button', { type: 'submit' }, 'Upload')),
      result));
}
