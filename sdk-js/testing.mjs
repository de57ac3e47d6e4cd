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
// What a hook returns is converted and checked as in Herald: a string body comes out as
// its UTF-8 bytes, and what Herald would refuse throws a HookFailure whose `reason` is
// what Herald records (`plugin:invalid_output: transform: request.body must be …`):
//
//   assert.throws(() => plugin.transform(context(), request({})), { reason: /^plugin:invalid_output/ });
//
// A body over Herald's output cap (`maxOutputBytes`, 4 MiB unless you say) throws a
// HookFailure whose reason is `plugin:output_too_large`, as in Herald.
//
// What Herald adds and this does not: the time and memory limits, the header syntax and
// the cap on headers and body together, the sandbox, and the line and column of an error
// (node's engine does not say them for a plugin's source); check those with
// `herald plugin run`.
import { readFileSync } from 'node:fs';
import { evaluate } from './plugin-host.js';

export { HookFailure } from './plugin-host.js';

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Loads the plugin at `path` (a path or file URL). Returns its hooks (`describe`,
 * `transform`, `classify`, `sign`, with Herald's conventions: an error thrown by
 * `transform` or `sign` comes out as its message string, anything else as a HookFailure)
 * and `logs`, the `[level, message]` lines it wrote. A source that Herald would refuse
 * at upload (it does not evaluate, defines no hook, or describes itself wrongly) throws a
 * HookFailure here.
 */
export function load(path, { config = {}, maxOutputBytes = 4 << 20 } = {}) {
  const logs = [];
  const host = {
    maxOutputBytes,
    log: (level, message) => logs.push([level, message]),
    getConfig: (key) => (Object.hasOwn(config, key) ? String(config[key]) : undefined),
    decode: (bytes) => decoder.decode(bytes),
    encode: (text) => encoder.encode(text),
  };
  const plugin = evaluate(readFileSync(path, 'utf8'), host);
  // Herald's load check: a source whose `describe` it would refuse is refused here too.
  plugin.describe();
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
