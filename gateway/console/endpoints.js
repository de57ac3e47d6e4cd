// Endpoints: health beside pacing for a page of them, and a form to add one (its signing
// secret shown once, on the new endpoint's page); one endpoint's settings, chart and actions
// (edit its URL, description, event types and headers, pause, enable, pacing, OAuth2, a
// broker destination, secret rotation, plugin bindings, delete, a test send of a catalog
// example), for a token that may manage it.
import { api, can, portal, tenantPath } from './api.js';
import { rateChart } from './chart.js';
import {
  copyable, facts, field, guard, h, lastErrorText, link, needs, percent, put, say, sayAcross, statusBadge, statusText, table, when,
} from './dom.js';

const HOOKS = ['transform', 'classify', 'sign'];

const PAGE = 50;

export async function endpointsPage(main, params) {
  const after = params.get('after') || undefined;
  const page = await api('GET', tenantPath('/endpoints'), { query: { limit: PAGE, health: true, after } });
  const rows = page.data;
  put(main, h('h1', {}, 'Endpoints'),
    h('p', { class: 'muted' }, 'Success rates count attempts answered 2xx; backlog counts deliveries not finished.'),
    table('Endpoints, their pacing and their health', [
      { label: 'URL', cls: 'url', cell: (e) => [link(`#/endpoints/${encodeURIComponent(e.id)}`, shownUrl(e)), target(e)] },
      { label: 'Kind', cell: (e) => e.kind },
      { label: 'Description', cls: 'url', cell: (e) => e.description },
      { label: 'Status', cell: (e) => statusBadge(e.delivery_status) },
      { label: 'Rate /s', num: true, cell: (e) => e.rate_per_sec },
      { label: 'Burst', num: true, cell: (e) => e.burst },
      { label: 'Max in flight', num: true, cell: (e) => e.max_in_flight },
      { label: 'Success 1 h', num: true, cell: (e) => percent(e.health.success_rate_1h) },
      { label: 'Success 24 h', num: true, cell: (e) => percent(e.health.success_rate_24h) },
      { label: 'Backlog', num: true, cell: (e) => e.health.backlog },
      { label: 'Last success', cell: (e) => when(e.health.last_success_at) },
      { label: 'Failing since', cell: (e) => when(e.health.failing_since) },
    ], rows, 'This tenant has no endpoints.'),
    h('nav', { 'aria-label': 'Endpoint pages' },
      after ? link('#/endpoints', 'First page') : null, ' ',
      page.next_after ? link(`#/endpoints?after=${encodeURIComponent(page.next_after)}`, 'Next page') : null),
    can('manage') && !portal()?.endpoints ? createForm() : null);
}

/** An endpoint's pinned payload versions (`invoice.paid v1, …`), or that it takes payloads as posted. */
function pinsText(pins) {
  const list = Object.entries(pins || {}).map(([type, v]) => `${type} v${v}`);
  return list.length ? list.join(', ') : 'as posted (no pins)';
}

/** An endpoint's URL as shown: a `poll` endpoint has none (its consumer reads it). */
function shownUrl(e) {
  return e.kind === 'poll' ? `${e.id} (pull delivery)` : e.url;
}

/** Where a broker endpoint's messages go besides its broker's URL (its stream, subject or
 *  exchange and routing key), or who reads a `poll` endpoint's; null for HTTP. */
function target(e) {
  if (e.kind === 'poll') return h('div', { class: 'target muted' }, 'read by its consumer: GET …/poll, scope poll');
  const d = e.destination;
  if (e.kind === 'http' || !d) return null;
  const where = {
    'redis-stream': () => `stream ${d.stream}`,
    nats: () => `subject ${d.subject}`,
    amqp: () => `exchange ${d.exchange ? d.exchange : '(default)'}, routing key ${d.routing_key}`,
  }[e.kind];
  return where ? h('div', { class: 'target muted' }, where()) : null;
}

/** The endpoint just added, its signing secret and its v1a public key, shown on its page. */
let added = null;

/** The Standard Webhooks signatures an endpoint may send: HMAC (`v1`), ed25519 (`v1a`). */
const SIGNATURES = [['v1', 'v1 (HMAC, shared secret)'], ['v1a', 'v1a (ed25519, public key)'], ['v1,v1a', 'v1 and v1a']];

function signatureSelect(current) {
  return h('select', { name: 'signatures' }, SIGNATURES.map(([v, label]) => h('option', { value: v, selected: v === current }, label)));
}

/** The kinds the form adds: pushed to a URL, or read by its consumer (`poll`, no URL). */
const KINDS = [['http', 'HTTP: pushed to a URL'], ['poll', 'Pull: read by its consumer']];

/** Adds an HTTP or a `poll` endpoint, then opens it, where its signing secret is shown once. */
function createForm() {
  const url = h('input', { name: 'url', type: 'url', required: true, placeholder: 'https://receiver.example/webhooks' });
  const urlField = field('URL', url);
  const kind = h('select', { name: 'kind', onchange: () => {
    // A `poll` endpoint has no URL: nothing is pushed.
    const pull = kind.value === 'poll';
    url.required = !pull;
    urlField.hidden = pull;
  } }, KINDS.map(([v, label]) => h('option', { value: v }, label)));
  const description = h('input', { name: 'description' });
  const types = h('input', { name: 'event_types', placeholder: 'comma separated; empty: every type' });
  const signatures = signatureSelect('v1');
  return h('section', { id: 'create' }, h('h2', {}, 'Add an endpoint'),
    h('form', { class: 'inline', 'aria-label': 'Add an endpoint', onsubmit: (ev) => {
      ev.preventDefault();
      guard(async () => {
        const event_types = types.value.split(',').map((t) => t.trim()).filter(Boolean);
        const body = { description: description.value, event_types, signatures: signatures.value.split(',') };
        if (kind.value === 'poll') body.kind = 'poll';
        else body.url = url.value.trim();
        const e = await api('POST', tenantPath('/endpoints'), { body });
        added = { id: e.id, secret: e.secret, publicKey: e.public_keys?.[0]?.public_key };
        sayAcross(`Endpoint ${e.id} added.`);
        location.hash = `#/endpoints/${encodeURIComponent(e.id)}`;
      });
    } }, field('Kind', kind), urlField, field('Description', description), field('Event types', types), field('Signatures', signatures),
    h('button', { type: 'submit' }, 'Add endpoint')));
}

/** The signing secret of the endpoint just added: once, where it can be copied. */
function addedSecret(id) {
  const fresh = added?.id === id ? added : null;
  added = null;
  if (!fresh) return null;
  return h('section', { id: 'new-secret', class: 'notice' }, h('h2', {}, 'Signing secret'),
    fresh.secret ? [h('p', {}, 'Your receiver verifies each delivery with this secret. It is shown this once: copy it now.'),
      copyable('new-secret-value', 'Signing secret', fresh.secret)] : null,
    fresh.publicKey ? [h('p', {}, 'Your receiver verifies the v1a signature with this public key (shown on the endpoint\'s page too).'),
      copyable('new-public-key', 'Public key', fresh.publicKey)] : null);
}

/** The signatures the endpoint sends, its v1a public keys and where a receiver fetches them. */
function signingSection(e) {
  const jwks = `${location.origin}${tenantPath('/jwks.json')}`;
  return h('section', { id: 'signing' }, h('h2', {}, 'Signatures'),
    facts([['Signatures', e.signatures.join(', ')]]),
    e.public_keys.map((k, i) => h('div', {}, copyable(`public-key-${i}`, `Public key ${k.kid}`, k.public_key),
      h('p', { class: 'muted' }, `kid ${k.kid}`, k.expires_at ? `; signs until ${when(k.expires_at)}` : ''))),
    e.signatures.includes('v1a') ? h('p', {}, 'The tenant\'s key set (JWKS, no token needed): ', link(jwks, jwks)) : null);
}

/** How long the page follows a test send's first attempt, and how often it looks. */
const FOLLOW_MS = 30000;
const FOLLOW_EVERY_MS = 500;

/** Sends one of the catalog's examples to this endpoint now, then follows the delivery
 *  until its first attempt is recorded and shows that attempt as it happened. */
async function testSendSection(e, path) {
  const types = await api('GET', tenantPath('/event-types')).catch(() => ({ data: [] }));
  const withExamples = types.data.filter((t) => t.examples.length > 0);
  const out = h('div', { id: 'test-send-result', 'aria-live': 'polite' });
  if (withExamples.length === 0) {
    return h('section', { id: 'test-send' }, h('h2', {}, 'Test send'),
      h('p', { class: 'muted' }, 'The event catalog has no type with an example to send.'));
  }
  const type = h('select', { name: 'event_type' }, withExamples.map((t) => h('option', { value: t.name }, t.name)));
  const example = h('select', { name: 'example' });
  const shown = h('pre', { id: 'test-send-example', class: 'example' });
  const examplesOf = () => withExamples.find((t) => t.name === type.value).examples;
  const showExample = () => { shown.textContent = JSON.stringify(examplesOf()[Number(example.value)], null, 2); };
  const listExamples = () => {
    example.replaceChildren(...examplesOf().map((x, i) => h('option', { value: String(i) }, `Example ${i}: ${brief(x)}`)));
    showExample();
  };
  type.addEventListener('change', listExamples);
  example.addEventListener('change', showExample);
  listExamples();
  return h('section', { id: 'test-send' }, h('h2', {}, 'Test send'),
    h('form', { class: 'inline', 'aria-label': 'Test send', onsubmit: (ev) => {
      ev.preventDefault();
      guard(async () => {
        const sent = await api('POST', `${path}/test-send`, { body: { event_type: type.value, example: Number(example.value || 0) } });
        out.replaceChildren(h('p', {}, `Sent ${sent.event_type} as event ${sent.event_id}; waiting for its attempt\u2026`));
        const attempt = await firstAttempt(sent.delivery_id);
        out.replaceChildren();
        put(out, attempt ? attemptFacts(sent, attempt)
          : h('p', {}, 'No attempt yet: ', link(`#/deliveries/${encodeURIComponent(sent.delivery_id)}`, 'follow the delivery')));
      });
    } }, field('Event type', type), field('Example', example), h('button', { type: 'submit' }, 'Send test event')),
    h('p', { class: 'muted' }, 'The example\u2019s payload, as the event\u2019s data:'), shown, out);
}

/** An example's JSON on one line, cut to fit an option. */
function brief(x) {
  const text = JSON.stringify(x);
  return text.length > 60 ? `${text.slice(0, 59)}\u2026` : text;
}

async function firstAttempt(deliveryId) {
  const until = Date.now() + FOLLOW_MS;
  const path = tenantPath(`/deliveries/${encodeURIComponent(deliveryId)}`);
  while (Date.now() < until) {
    const d = await api('GET', path);
    if (d.attempt_history.length > 0) return d.attempt_history[0];
    await new Promise((r) => { setTimeout(r, FOLLOW_EVERY_MS); });
  }
  return null;
}

function attemptFacts(sent, a) {
  return [h('h3', {}, 'Attempt ', String(a.number)), facts([
    ['Status', a.status === null ? 'no response' : String(a.status)], ['Verdict', a.verdict],
    ['Duration', `${a.duration_ms} ms`], ['Started', when(a.started_at)], ['Error', a.error || '—'],
    ['Response body', a.response_body || '—'],
  ]), h('p', {}, link(`#/deliveries/${encodeURIComponent(sent.delivery_id)}`, 'The delivery'))];
}

export async function endpointPage(main, id, rerender) {
  const path = tenantPath(`/endpoints/${encodeURIComponent(id)}`);
  // Drawn first: an unknown id is said under them.
  put(main, h('p', {}, link('#/endpoints', 'All endpoints')), h('h1', {}, 'Endpoint ', id), addedSecret(id));
  const manage = can('manage');
  const withPlugins = !portal() || portal().plugins;
  const [e, series, plugins] = await Promise.all([
    api('GET', path),
    api('GET', tenantPath('/series'), { query: { endpoint: id } }),
    manage && withPlugins ? api('GET', tenantPath('/plugins')).catch(() => ({ data: [] })) : null,
  ]);
  const hl = e.health;
  const headers = Object.entries(e.headers);
  put(main,
    h('section', {}, h('h2', {}, 'Health and pacing'), facts([
      e.kind === 'poll' ? ['URL', 'none: nothing is pushed'] : ['URL', e.url], ['Kind', e.kind],
      e.kind === 'http' ? null : [e.kind === 'poll' ? 'Read by' : 'Sends to', target(e)],
      ['Description', e.description || '—'], ['Event types', e.event_types.join(', ') || 'every type'],
      ['Filter', e.filter ? JSON.stringify(e.filter) : 'none (every event of its types)'],
      ['Headers', headers.length ? headers.map(([k, v]) => `${k}: ${v}`).join('\n') : 'none'],
      ['Delivery status', statusText(e.delivery_status)],
      ['Last error', lastErrorText(e.delivery_status.last_error)],
      e.verification ? ['Verification', verificationText(e.verification)] : null,
      ['Rate /s', String(e.rate_per_sec)], ['Burst', String(e.burst)], ['Max in flight', String(e.max_in_flight)],
      ['Ordering', e.ordering === 'none' ? 'none (in parallel)' : `${e.ordering}; a dead letter: ${e.ordering_on_dead}`],
      ['Payload versions', pinsText(e.payload_versions)],
      ['Output', e.cloudevents ? `CloudEvents ${e.cloudevents.mode}; source ${e.cloudevents.source || '/herald/tenants/{tenant}'}` : 'Standard Webhooks envelope'],
      ['Success rate 1 h', `${percent(hl.success_rate_1h)} of ${hl.attempts_1h}`],
      ['Success rate 24 h', `${percent(hl.success_rate_24h)} of ${hl.attempts_24h}`],
      ['Backlog', String(hl.backlog)], ['Dead letters', String(hl.dead_letters)],
      ['Last success', when(hl.last_success_at)], ['Last attempt', when(hl.last_attempt_at)],
      ['Failing since', when(hl.failing_since)],
      withPlugins ? ['Plugins', HOOKS.map((k) => `${k}: ${e.plugins[k] ?? '—'}`).join(', ')] : null,
    ].filter(Boolean)), h('p', {}, link(`#/deliveries?endpoint=${encodeURIComponent(e.id)}`, 'Its deliveries'), ' · ',
      link(`#/dead-letters?endpoint=${encodeURIComponent(e.id)}`, 'Its dead letters'))),
    signingSection(e),
    settingsSection(e),
    h('section', {}, h('h2', {}, 'Delivery rate and latency, last hour'), rateChart(`Endpoint ${e.id}`, series)),
    manage ? actions(e, path, plugins?.data, rerender)
      : h('section', { id: 'actions' }, h('h2', {}, 'Actions'), needs('manage-needed', 'Changing an endpoint', 'manage')),
    manage ? await testSendSection(e, path) : null,
    manage ? deleteSection(e, path) : null);
}

/** Where an endpoint's verification stands: its state, and why and until when it waits. */
function verificationText(v) {
  if (v.state === 'verified') return `verified ${when(v.last_tried_at)}`;
  const why = v.reason ? `: ${v.reason}` : '';
  return `${v.state}${why}; deliveries wait (next try ${when(v.next_try_at)})`;
}

/** What a receiver is told about the endpoint's settings: its URL, description, event
 *  types, content filter (JSON; empty removes it), custom headers (`Name: value`, one a
 *  line), its output (Standard Webhooks' envelope or CloudEvents, binary or structured, its
 *  `source` kept) and, for HTTP, its `User-Agent` and whether it must verify its URL. Only
 *  what changed is sent, so an unchanged list of types is not checked again against the
 *  catalog. */
function editForm(e, path, submit, done) {
  const headerText = (hs) => Object.entries(hs).map(([k, v]) => `${k}: ${v}`).join('\n');
  const filterText = (f) => (f ? JSON.stringify(f) : '');
  const pull = e.kind === 'poll';
  const url = h('input', { name: 'url', required: !pull, value: e.url, class: 'wide' });
  const description = h('input', { name: 'description', value: e.description, class: 'wide' });
  const types = h('input', { name: 'event_types', value: e.event_types.join(', '), class: 'wide', placeholder: 'comma separated; empty: every type' });
  const filter = h('textarea', { name: 'filter', rows: '2', class: 'wide', placeholder: '{"data.amount": {"$gte": 100}}; empty: every event' }, filterText(e.filter));
  const headers = h('textarea', { name: 'headers', rows: '3', class: 'wide', placeholder: 'X-Name: value, one a line' }, headerText(e.headers));
  const http = e.kind === 'http';
  const userAgent = h('input', { name: 'user_agent', value: e.user_agent || '', class: 'wide', placeholder: "empty: Herald's (herald/<version>)" });
  const mode = e.cloudevents ? e.cloudevents.mode : '';
  const output = h('select', { name: 'cloudevents' }, [['', 'Standard Webhooks envelope'], ['binary', 'CloudEvents, binary'],
    ['structured', 'CloudEvents, structured']].map(([v, label]) => h('option', { value: v, selected: v === mode }, label)));
  const verify = h('input', { name: 'verify', type: 'checkbox', checked: e.verify });
  return h('form', { class: 'inline', 'aria-label': 'Edit endpoint', onsubmit: submit(async () => {
    const body = {};
    if (!pull && url.value.trim() !== e.url) body.url = url.value.trim();
    if (description.value !== e.description) body.description = description.value;
    const eventTypes = types.value.split(',').map((t) => t.trim()).filter(Boolean);
    if (eventTypes.join(',') !== e.event_types.join(',')) body.event_types = eventTypes;
    if (filter.value.trim() !== filterText(e.filter)) body.filter = parseFilter(filter.value);
    if (headers.value.trim() !== headerText(e.headers)) body.headers = parseHeaders(headers.value);
    if (http && userAgent.value.trim() !== (e.user_agent || '')) body.user_agent = userAgent.value.trim();
    if (output.value !== mode) {
      const source = e.cloudevents && e.cloudevents.source ? { source: e.cloudevents.source } : {};
      body.cloudevents = output.value ? { mode: output.value, ...source } : null;
    }
    if (http && verify.checked !== e.verify) body.verify = verify.checked;
    if (Object.keys(body).length === 0) throw new Error('Nothing changed.');
    await api('PATCH', path, { body });
    done('Endpoint saved.');
  }) }, pull ? null : field('URL', url), field('Description', description), field('Event types', types),
  field('Filter (JSON)', filter), field('Headers (Name: value, one a line)', headers), field('Output', output),
  http ? field('User-Agent', userAgent) : null,
  http ? field('Verify the URL (a signed challenge it must echo) before delivering', verify) : null,
  h('button', { type: 'submit' }, 'Save endpoint'));
}

/** A filter as typed: JSON, or nothing (null: no filter). */
function parseFilter(text) {
  if (!text.trim()) return null;
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`filter: not JSON (${err.message})`);
  }
}

/** `Name: value` lines as a header map; a line without a colon is refused, naming it. */
function parseHeaders(text) {
  const out = {};
  text.split('\n').map((l) => l.trim()).forEach((line, i) => {
    if (!line) return;
    const colon = line.indexOf(':');
    if (colon < 1) throw new Error(`headers: line ${i + 1} (${JSON.stringify(line)}) is not Name: value`);
    out[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
  });
  return out;
}

/** Deletes the endpoint after a second click that says what it does. */
function deleteSection(e, path) {
  const confirm = h('div', { id: 'delete-confirm', class: 'notice', hidden: true },
    h('p', {}, `Delete ${shownUrl(e)}? Its deliveries not yet delivered become dead letters (endpoint_deleted); this cannot be undone.`),
    h('button', { type: 'button', id: 'delete-confirmed', class: 'danger', onclick: () => guard(async () => {
      await api('DELETE', path);
      sayAcross(`Endpoint ${e.id} deleted.`);
      location.hash = '#/endpoints';
    }) }, 'Delete it'), ' ',
    h('button', { type: 'button', class: 'secondary', onclick: () => { confirm.hidden = true; } }, 'Keep it'));
  return h('section', { id: 'delete' }, h('h2', {}, 'Delete'),
    h('button', { type: 'button', id: 'delete-endpoint', class: 'danger', onclick: () => { confirm.hidden = false; } }, 'Delete endpoint\u2026'),
    confirm);
}

/** How the endpoint's requests authenticate: OAuth2 settings (never the secret), this
 *  node's token and the last token error. */
function authSection(e) {
  const o = e.oauth2;
  const t = e.token;
  const rows = o ? [
    ['OAuth2 token URL', o.token_url], ['Client id', o.client_id], ['Client secret', o.client_secret_set ? 'set' : 'not set'],
    ['Scopes', o.scopes.join(' ') || '—'], ['Audience', o.audience || '—'], ['Client authentication', o.client_auth],
    ['Token', t ? `${t.state}${t.refresh_at ? `, refreshed ${when(t.refresh_at)}` : ''} (${t.fetches} fetched on this node)` : '—'],
    ['Last token error', (t && t.last_error) || '—'],
  ] : [['OAuth2', 'none: requests carry only the signature and custom headers']];
  // The node's proxy is the operator's business: a customer sees only one of the endpoint's own.
  if (e.proxy || !portal()) rows.push(['Egress proxy', e.proxy ?? "the node's"]);
  rows.push(['TLS client certificate', e.tls && e.tls.client_cert ? `set (key ${e.tls.client_key_set ? 'set' : 'missing'})` : 'none']);
  rows.push(['Private CA bundle', e.tls && e.tls.ca_bundle ? 'set' : 'none: public roots only']);
  return h('section', { id: 'auth' }, h('h2', {}, 'Authentication'), facts(rows));
}

/** Its kind's own settings: HTTP's authentication, a broker's destination; none for `poll`. */
function settingsSection(e) {
  if (e.kind === 'poll') return null;
  return e.kind === 'http' ? authSection(e) : destinationSection(e);
}

/** The form of its kind's own settings (none for `poll`, which its consumer reads). */
function settingsForm(e, path, submit, done) {
  if (e.kind === 'poll') return null;
  return e.kind === 'http' ? oauth2Form(e, path, submit, done) : destinationForm(e, path, submit, done);
}

/** The settings of each broker kind, as the API names them: the template first. */
const DESTINATION_FIELDS = {
  'redis-stream': [['stream', 'Stream'], ['maxlen', 'MAXLEN ~'], ['username', 'Username']],
  nats: [['subject', 'Subject'], ['username', 'Username']],
  amqp: [['exchange', 'Exchange'], ['routing_key', 'Routing key'], ['username', 'Username']],
};

/** A broker endpoint's destination (never its password or token, only whether one is set). */
function destinationSection(e) {
  const d = e.destination || {};
  const rows = (DESTINATION_FIELDS[e.kind] || []).map(([k, label]) => [label, d[k] == null ? '—' : String(d[k])]);
  rows.push(['Password', d.password_set ? 'set' : 'not set']);
  if (e.kind === 'nats') rows.push(['Token', d.token_set ? 'set' : 'not set']);
  return h('section', { id: 'destination' }, h('h2', {}, 'Destination'), facts(rows));
}

/** A broker destination's settings; an empty password or token keeps the stored one. */
function destinationForm(e, path, submit, done) {
  const d = e.destination || {};
  const inputs = (DESTINATION_FIELDS[e.kind] || []).map(([k, label]) =>
    [k, label, h('input', { name: k, value: d[k] == null ? '' : String(d[k]), type: k === 'maxlen' ? 'number' : 'text' })]);
  const secrets = [['password', 'Password', d.password_set]].concat(e.kind === 'nats' ? [['token', 'Token', d.token_set]] : [])
    .map(([k, label, set]) => [k, label, h('input', { name: k, type: 'password', autocomplete: 'off', placeholder: set ? 'set; empty keeps it' : '' })]);
  return h('form', { class: 'inline', 'aria-label': 'Destination', onsubmit: submit(async () => {
    const destination = {};
    for (const [k, , input] of inputs) destination[k] = k === 'maxlen' ? Number(input.value || 0) : input.value;
    for (const [k, , input] of secrets) if (input.value) destination[k] = input.value;
    await api('PATCH', path, { body: { destination } });
    done('Destination saved.');
  }) }, inputs.concat(secrets).map(([, label, input]) => field(label, input)), h('button', { type: 'submit' }, 'Save destination'));
}

/** The hook's selector: none, the tenant's plugins with that hook, and whatever the
 *  endpoint binds now even when no listed plugin is it (a pinned `name@version`, a plugin
 *  that is not listed): the page shows every binding, so saving keeps what it showed. */
function bindingSelect(hook, bound, plugins) {
  const names = plugins.filter((p) => p.hooks.includes(hook)).map((p) => p.name);
  if (bound && !names.includes(bound)) names.unshift(bound);
  return h('select', { name: hook }, h('option', { value: '' }, 'none'),
    names.map((n) => h('option', { value: n, selected: n === bound }, n)));
}

/** OAuth2 settings; an empty secret keeps the stored one (it is write-only). */
function oauth2Form(e, path, submit, done) {
  const o = e.oauth2 || {};
  const url = h('input', { name: 'token_url', value: o.token_url || '', placeholder: 'https://auth.example/oauth/token' });
  const client = h('input', { name: 'client_id', value: o.client_id || '' });
  const secret = h('input', { name: 'client_secret', type: 'password', autocomplete: 'off',
    placeholder: o.client_secret_set ? 'set; empty keeps it' : '' });
  const scopes = h('input', { name: 'scopes', value: (o.scopes || []).join(' '), placeholder: 'space separated' });
  const audience = h('input', { name: 'audience', value: o.audience || '' });
  const method = h('select', { name: 'client_auth' }, ['client_secret_basic', 'client_secret_post'].map((m) =>
    h('option', { value: m, selected: m === (o.client_auth || 'client_secret_basic') }, m)));
  return h('form', { class: 'inline', 'aria-label': 'OAuth2', onsubmit: submit(async () => {
    const oauth2 = { token_url: url.value, client_id: client.value, scopes: scopes.value.split(' ').filter(Boolean),
      audience: audience.value, client_auth: method.value };
    if (secret.value) oauth2.client_secret = secret.value;
    await api('PATCH', path, { body: { oauth2: url.value ? oauth2 : null } });
    done(url.value ? 'OAuth2 saved.' : 'OAuth2 removed.');
  }) }, field('Token URL (empty removes OAuth2)', url), field('Client id', client), field('Client secret', secret),
  field('Scopes', scopes), field('Audience', audience), field('Client authentication', method),
  h('button', { type: 'submit' }, 'Save OAuth2'));
}

function actions(e, path, plugins, rerender) {
  const done = (msg) => { say(msg); rerender(); };
  const pauseFor = h('input', { name: 'for', placeholder: 'e.g. 15m; empty: until enabled' });
  const reason = h('input', { name: 'reason', placeholder: 'why' });
  const rate = h('input', { name: 'rate_per_sec', type: 'number', step: 'any', min: '0', value: e.rate_per_sec });
  const burst = h('input', { name: 'burst', type: 'number', min: '1', value: e.burst });
  const inflight = h('input', { name: 'max_in_flight', type: 'number', min: '1', value: e.max_in_flight });
  const choose = (name, values, current) => h('select', { name },
    values.map((v) => h('option', { value: v, selected: v === current }, v)));
  const ordering = choose('ordering', ['none', 'endpoint', 'key'], e.ordering);
  const onDead = choose('ordering_on_dead', ['skip', 'block'], e.ordering_on_dead);
  const secretOut = h('div', { id: 'rotated', 'aria-live': 'polite' });
  const signatures = signatureSelect(e.signatures.join(','));
  const binds = Object.fromEntries(HOOKS.map((k) => [k, bindingSelect(k, e.plugins[k], plugins || [])]));
  const submit = (f) => (ev) => { ev.preventDefault(); guard(f); };
  return h('section', { id: 'actions' }, h('h2', {}, 'Actions'),
    h('h3', {}, 'Where it sends and what'), editForm(e, path, submit, done),
    h('h3', {}, 'How it sends'),
    h('form', { class: 'inline', 'aria-label': 'Pause', onsubmit: submit(async () => {
      await api('POST', `${path}/pause`, { body: { for: pauseFor.value || undefined, reason: reason.value || undefined } });
      done('Endpoint paused.');
    }) }, field('Pause for', pauseFor), field('Reason', reason), h('button', { type: 'submit' }, 'Pause')),
    h('form', { class: 'inline', 'aria-label': 'Enable', onsubmit: submit(async () => {
      await api('POST', `${path}/enable`);
      done('Endpoint enabled.');
    }) }, h('button', { type: 'submit' }, 'Enable')),
    e.verify ? h('form', { class: 'inline', 'aria-label': 'Verify now', onsubmit: submit(async () => {
      await api('POST', `${path}/verify`);
      done('Verification asked for: the handshake goes out now.');
    }) }, h('button', { type: 'submit' }, 'Verify now')) : null,
    h('form', { class: 'inline', 'aria-label': 'Pacing', onsubmit: submit(async () => {
      await api('PATCH', path, { body: { rate_per_sec: Number(rate.value), burst: Number(burst.value), max_in_flight: Number(inflight.value) } });
      done('Pacing saved.');
    }) }, field('Rate per second', rate), field('Burst', burst), field('Max in flight', inflight), h('button', { type: 'submit' }, 'Save pacing')),
    h('form', { class: 'inline', 'aria-label': 'Ordering', onsubmit: submit(async () => {
      await api('PATCH', path, { body: { ordering: ordering.value, ordering_on_dead: onDead.value } });
      done('Ordering saved.');
    }) }, field('Ordering', ordering), field('A dead letter', onDead), h('button', { type: 'submit' }, 'Save ordering')),
    // `null`: this session may not reach plugins (the portal, unless the operator allows).
    // A `poll` endpoint runs no plugins and has no destination: its consumer reads it.
    plugins && e.kind !== 'poll' ? h('form', { class: 'inline', 'aria-label': 'Plugins', onsubmit: submit(async () => {
      const chosen = Object.fromEntries(Object.entries(binds).filter(([, s]) => s.value).map(([k, s]) => [k, s.value]));
      await api('PATCH', path, { body: { plugins: chosen } });
      done('Plugin bindings saved.');
    }) }, field('Transform plugin', binds.transform), field('Classify plugin', binds.classify), field('Sign plugin', binds.sign),
    h('button', { type: 'submit' }, 'Bind plugins')) : null,
    settingsForm(e, path, submit, done),
    h('form', { class: 'inline', 'aria-label': 'Signatures', onsubmit: submit(async () => {
      await api('PATCH', path, { body: { signatures: signatures.value.split(',') } });
      done('Signatures saved.');
    }) }, field('Signatures', signatures), h('button', { type: 'submit' }, 'Save signatures')),
    h('form', { class: 'inline', 'aria-label': 'Rotate secret', onsubmit: submit(async () => {
      const r = await api('POST', `${path}/rotate-secret`, { body: {} });
      const until = when(r.previous_valid_until);
      secretOut.replaceChildren(
        r.secret ? [h('p', {}, `New secret (shown this once); the previous one keeps signing until ${until}:`),
          copyable('rotated-secret', 'New signing secret', r.secret)] : null,
        r.public_key ? [h('p', {}, `New public key; the previous key keeps signing until ${until}:`),
          copyable('rotated-public-key', 'New public key', r.public_key.public_key)] : null);
      say('Secret rotated.');
    }) }, h('button', { type: 'submit' }, 'Rotate secret')), secretOut);
}
