import { test } from 'node:test';
import assert from 'node:assert/strict';
import { load, context, request, json } from '../testing.mjs';

const plugin = (config) => load(new URL('./transform-chat.js', import.meta.url), { config });

test('describes itself as a transform', () => {
  assert.deepEqual(plugin().describe().hooks, { transform: true, classify: false, sign: false });
});

test('reshapes the envelope into a chat message', () => {
  const out = plugin({ prefix: '> ' }).transform(
    context({ eventType: 'invoice.paid' }),
    request({ id: 'evt_1', type: 'invoice.paid', data: { summary: 'paid $5' } }),
  );
  assert.equal(out.tag, 'send');
  assert.deepEqual(json(out.val.body), { text: '> invoice.paid: paid $5' });
});

test('drops test events', () => {
  const out = plugin().transform(context({ eventType: 'ping.test' }), request({ type: 'ping.test', data: {} }));
  assert.equal(out.tag, 'drop');
});
