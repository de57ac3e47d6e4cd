// Unit-test a Herald JavaScript plugin under node, without Herald: the plugin is
// evaluated by the same rules as in Herald (plugin-host.js), with the config you give and
// its log lines kept. Use it with node's built-in test runner:
//
//   import { test } from 'node:test';
//   import assert from 'node:assert/strict';
//   import { load, context, request, json } from './testing.mjs';
//
//   test('reshapes the body', () => {
//     const plugin = load(new URL('./plugin.js', import.meta.url), { config: { prefix: '> ' } });
//     const out = plugin.transform(context(), request({ type: 'x.y', data: {} }));
//     assert.equal(out.tag, 'send');
//     assert.deepEqual(json(out.val.body), { text: '> x.y: {}' });
//   });
//
// What Herald adds and this does not: the time and memory limits, the output checks
// (header syntax, size caps) and the sandbox; check those with `herald plugin run`.
import { readFileSync } from 'node:fs';
import { evaluate } from './plugin-host.js';

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Loads the plugin at `path` (a path or file URL). Returns its hooks (`describe`,
 * `transform`, `classify`, `sign`, with Herald's conventions: a thrown error comes out as
 * its message string) and `logs`, the `[level, message]` lines it wrote.
 */
export function load(path, { config = {} } = {}) {
  const logs = [];
  const host = {
    log: (level, message) => logs.push([level, message]),
    getConfig: (key) => (Object.hasOwn(config, key) ? String(config[key]) : undefined),
    decode: (bytes) => decoder.decode(bytes),
    encode: (text) => encoder.encode(text),
  };
  const plugin = evaluate(readFileSync(path, 'utf8'), host);
  return { ...plugin, logs };
}

/** A delivery context with test values; `fields` override them. */
export function context(fields = {}) {
  return {
    tenant: 'acme',
    endpointId: 'ep_test',
    eventId: 'evt_test',
    eventType: 'invoice.paid',
    attempt: 1,
    timestamp: 1700000000n,
    attemptId: 'att_test',
    ...fields,
  };
}

/** A request whose body is `body` (an object is sent as JSON, a string as its text). */
export function request(body, headers = [['content-type', 'application/json']]) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  return { headers, body: encoder.encode(text) };
}

/** A response outcome for `classify`. */
export function response(status, body = '', headers = []) {
  return { tag: 'response', val: { status, headers, body: encoder.encode(body) } };
}

/** A transport-error outcome for `classify` (`kind`: 'timeout', 'dns', 'tls', …). */
export function transportError(kind, message = kind) {
  return { tag: 'transport-error', val: { kind, message } };
}

/** The text of a body. */
export function text(bytes) {
  return decoder.decode(bytes);
}

/** The JSON of a body. */
export function json(bytes) {
  return JSON.parse(decoder.decode(bytes));
}
