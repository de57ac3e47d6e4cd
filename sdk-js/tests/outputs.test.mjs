// The cases of outputs.json under node, through the test helper: what a hook may return
// and what Herald records when it may not. tests/it/js.rs runs the same cases through
// `herald plugin run`, so a plugin whose unit test passes here behaves the same in Herald.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runInNewContext } from 'node:vm';
import { load, context, request, response, text, HookFailure } from '../testing.mjs';

const { cases } = JSON.parse(readFileSync(new URL('./outputs.json', import.meta.url), 'utf8'));
const dir = mkdtempSync(join(tmpdir(), 'herald-outputs-'));

function plugin(source) {
  const path = join(dir, 'plugin.js');
  writeFileSync(path, source);
  return load(path);
}

function call(p, hook) {
  const req = request({ n: 1 });
  if (hook === 'transform') return p.transform(context(), req);
  if (hook === 'classify') return p.classify(context(), response(500));
  return p.sign(context(), [new TextEncoder().encode('k')], req);
}

for (const c of cases) {
  test(c.name, () => {
    const p = plugin(c.source);
    if (c.reason) {
      assert.throws(() => call(p, c.hook), (e) => e instanceof HookFailure && e.reason === c.reason);
      return;
    }
    const out = call(p, c.hook);
    if (c.body !== undefined) {
      assert.equal(out.tag, 'send');
      assert.ok(out.val.body instanceof Uint8Array);
      assert.equal(text(out.val.body), c.body);
    }
    if (c.drop !== undefined) assert.deepEqual(out, { tag: 'drop', val: c.drop });
    if (c.verdict !== undefined) assert.equal(out.tag, c.verdict);
    if (c.headers !== undefined) assert.deepEqual(out, c.headers);
    if (c.logs !== undefined) assert.deepEqual(p.logs, c.logs);
  });
}

test('a source that does not evaluate is refused at load as an error', () => {
  assert.throws(() => plugin('function transform(ctx, req) {\n  return {;\n}'), (e) => {
    return e instanceof HookFailure && e.kind === 'error' && e.message.startsWith('SyntaxError: ');
  });
  assert.throws(() => plugin('const plugin = {};'), {
    reason: 'plugin:error: the source defines none of the functions transform, classify, sign',
  });
});

test('a thrown transform error is the error result, a string', () => {
  const p = plugin("function transform() { throw new Error('no thanks'); }");
  assert.throws(() => p.transform(context(), request({})), (e) => e === 'Error: no thanks');
});

test("a body of another realm is sent as its bytes, as in Herald (whose runtime hands req.body over so)", () => {
  const p = plugin('function transform(ctx, req) { return { headers: req.headers, body: req.body }; }');
  for (const source of ['new Uint8Array([104, 105])', 'new DataView(new Uint8Array([0, 104, 105]).buffer, 1)', 'new Uint8Array([104, 105]).buffer']) {
    const body = runInNewContext(source);
    assert.ok(!(body instanceof Uint8Array), source);
    const out = p.transform(context(), { headers: [], body });
    assert.ok(out.val.body instanceof Uint8Array, source);
    assert.equal(text(out.val.body), 'hi', source);
  }
});

test('an over-long name is cut to 128, never inside a pair, as Herald keeps it', () => {
  const p = plugin("const plugin = { name: 'n'.repeat(8 << 20), version: 'x'.repeat(127) + '\\u{1F600}' };\nfunction transform(ctx, req) { return req; }");
  const info = p.describe();
  assert.equal(info.name, 'n'.repeat(128));
  assert.equal(info.version, 'x'.repeat(127));
});
