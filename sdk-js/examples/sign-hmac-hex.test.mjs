import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { load, context, request } from '../testing.mjs';

const plugin = (config) => load(new URL('./sign-hmac-hex.js', import.meta.url), { config });
const encoder = new TextEncoder();

test('signs t=<ts>,v1=<hex> with every secret, as node:crypto computes it', () => {
  const secrets = ['newest secret', 'older secret'].map((s) => encoder.encode(s));
  const [[name, value]] = plugin().sign(context({ timestamp: 1700000000n }), secrets, request('{"a":1}'));
  const want = ['newest secret', 'older secret']
    .map((s) => `v1=${createHmac('sha256', s).update('1700000000.{"a":1}').digest('hex')}`);
  assert.equal(name, 'x-signature');
  assert.equal(value, ['t=1700000000', ...want].join(','));
});

test('a key longer than a block is hashed first', () => {
  const key = 'k'.repeat(100);
  const [[, value]] = plugin({ header: 'sig' }).sign(context({ timestamp: 1n }), [encoder.encode(key)], request(''));
  assert.equal(value, `t=1,v1=${createHmac('sha256', key).update('1.').digest('hex')}`);
});

test('no secret fails the call with a message', () => {
  assert.throws(() => plugin().sign(context(), [], request('')), (e) => e === 'Error: the endpoint has no signing secret');
});
