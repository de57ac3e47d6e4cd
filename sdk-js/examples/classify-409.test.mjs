import { test } from 'node:test';
import assert from 'node:assert/strict';
import { load, context, response, transportError } from '../testing.mjs';

const plugin = (config) => load(new URL('./classify-409.js', import.meta.url), { config });

test('a 409 is delivered by default', () => {
  assert.deepEqual(plugin().classify(context(), response(409)), { tag: 'delivered' });
});

test('a 409 can be retried after a configured delay', () => {
  const verdict = plugin({ on_409: 'retry', retry_after: '30' }).classify(context(), response(409));
  assert.deepEqual(verdict, { tag: 'retry', val: 30 });
});

test('everything else goes to the built-in table', () => {
  assert.deepEqual(plugin().classify(context(), response(500)), { tag: 'default' });
  assert.deepEqual(plugin().classify(context(), transportError('timeout')), { tag: 'default' });
});

test('an unknown setting is logged and deferred', () => {
  const p = plugin({ on_409: 'maybe' });
  assert.deepEqual(p.classify(context(), response(409)), { tag: 'default' });
  assert.equal(p.logs[0][0], 'warn');
});
