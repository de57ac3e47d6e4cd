// How Herald runs a JavaScript plugin, shared by the runtime component (runtime.js, inside
// Herald) and the test helper (testing.mjs, under node), so a plugin behaves the same in
// both. No imports: the caller passes in what the plugin may reach (`host`).
//
// A plugin is a script that defines any of the top-level functions `transform`,
// `classify` and `sign`, and optionally a top-level `plugin` object (`name`, `version`,
// `classifyStatuses`) or its own `describe()`. It sees the JS built-ins, a `console` that
// writes to Herald's log, and `herald`: `log(level, message)`, `config(key)`,
// `text(bytes)`, `bytes(text)`. Data follows the WIT as types/ shows it: records are
// objects with camelCase fields, `list<u8>` is a Uint8Array, variants are `{ tag, val }`.

const HOOKS = ['transform', 'classify', 'sign'];
const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];

/** The error text of anything thrown. */
export function messageOf(e) {
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/**
 * Evaluates `source` once and returns its hooks, given `host`:
 * `{ log(level, message), getConfig(key) }`, `decode(bytes)`, `encode(text)`.
 */
export function evaluate(source, host) {
  const herald = {
    log: (level, message) => host.log(LEVELS.includes(level) ? level : 'info', String(message)),
    config: (key) => host.getConfig(String(key)),
    text: (bytes) => host.decode(bytes),
    bytes: (text) => host.encode(String(text)),
  };
  const line = (level) => (...args) => herald.log(level, args.map(String).join(' '));
  const console = { log: line('info'), info: line('info'), debug: line('debug'), warn: line('warn'), error: line('error') };
  const names = [...HOOKS, 'describe', 'plugin'];
  const pick = names.map((n) => `typeof ${n} === 'undefined' ? undefined : ${n}`).join(', ');
  let values;
  try {
    values = new Function('herald', 'console', `"use strict";\n${source}\n;return [${pick}];`)(herald, console);
  } catch (e) {
    herald.log('error', `evaluating the plugin failed: ${messageOf(e)}`);
    throw e;
  }
  const p = Object.fromEntries(names.map((n, i) => [n, values[i]]));
  return {
    describe: () => describe(p),
    transform: (ctx, req) => asError(() => transformResult(p.transform(ctx, req))),
    classify: (ctx, outcome) => verdictOf(p.classify(ctx, outcome)),
    sign: (ctx, secrets, req) => asError(() => p.sign(ctx, secrets, req)),
  };
}

function describe(p) {
  if (typeof p.describe === 'function') return p.describe();
  const meta = p.plugin ?? {};
  const hooks = {};
  for (const h of HOOKS) hooks[h] = typeof p[h] === 'function';
  return {
    name: String(meta.name ?? 'js'),
    version: String(meta.version ?? '0.0.0'),
    hooks,
    classifyStatuses: meta.classifyStatuses,
  };
}

// A `result` export: what is thrown becomes the `error` string.
function asError(f) {
  try {
    return f();
  } catch (e) {
    throw messageOf(e);
  }
}

// `{ tag: 'send' | 'drop', val }`, or a bare request (sent), or nothing (dropped).
function transformResult(out) {
  if (out === null || out === undefined) return { tag: 'drop', val: 'transform returned nothing' };
  if (out.tag === 'send' || out.tag === 'drop') return out;
  return { tag: 'send', val: out };
}

// A verdict, a bare tag such as 'delivered', or nothing (the built-in table).
function verdictOf(verdict) {
  if (verdict === null || verdict === undefined) return { tag: 'default' };
  if (typeof verdict === 'string') return { tag: verdict };
  return verdict;
}
