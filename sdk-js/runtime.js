// Herald's JavaScript runtime: one component (built by scripts/build-js-runtime with
// componentize-js) that exports the `herald:plugin` hooks and runs them by evaluating a
// tenant's plugin source, which it reads from the `js-source` import once per instance.
//
// A plugin is a script that defines any of the top-level functions `transform`,
// `classify` and `sign` (and optionally `describe`, or a top-level `plugin` object with
// `name`, `version` and `classifyStatuses`). Data follows the WIT as `sdk-js/herald.d.ts`
// types it: records are objects with camelCase fields, `list<u8>` is a Uint8Array,
// variants are `{ tag, val }`. A `transform` or `sign` that throws fails the attempt
// with the thrown message. The same evaluation rules are used by `sdk-js/testing.mjs`.
import { source } from 'herald:plugin/js-source@0.1.0';
import { log, getConfig } from 'herald:plugin/host@0.1.0';

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];

// What a plugin script sees besides the JS built-ins.
const herald = {
  log(level, message) {
    log(LEVELS.includes(level) ? level : 'info', String(message));
  },
  config(key) {
    return getConfig(String(key));
  },
  text(bytes) {
    return new TextDecoder().decode(bytes);
  },
  bytes(text) {
    return new TextEncoder().encode(text);
  },
};

const HOOKS = ['transform', 'classify', 'sign'];
let loaded = null;

function messageOf(e) {
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

function evaluate() {
  const text = source();
  const names = [...HOOKS, 'describe', 'plugin'];
  const pick = names.map((n) => `typeof ${n} === 'undefined' ? undefined : ${n}`).join(', ');
  const body = `"use strict";\n${text}\n;return [${pick}];`;
  let values;
  try {
    values = new Function('herald', 'console', body)(herald, consoleFor());
  } catch (e) {
    herald.log('error', `evaluating the plugin failed: ${messageOf(e)}`);
    throw e;
  }
  const found = Object.fromEntries(names.map((n, i) => [n, values[i]]));
  return found;
}

function consoleFor() {
  const line = (level) => (...args) => herald.log(level, args.map(String).join(' '));
  return { log: line('info'), info: line('info'), debug: line('debug'), warn: line('warn'), error: line('error') };
}

function plugin() {
  if (loaded === null) loaded = evaluate();
  return loaded;
}

export function describe() {
  const p = plugin();
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

function guard(hook, f) {
  try {
    return f();
  } catch (e) {
    // A `result` export: what is thrown becomes the `error` string.
    throw messageOf(e);
  }
}

export function transform(ctx, req) {
  return guard('transform', () => {
    const out = plugin().transform(ctx, req);
    if (out === null || out === undefined) return { tag: 'drop', val: 'transform returned nothing' };
    if (out.tag === 'send' || out.tag === 'drop') return out;
    return { tag: 'send', val: out };
  });
}

export function classify(ctx, outcome) {
  const verdict = plugin().classify(ctx, outcome);
  if (verdict === null || verdict === undefined) return { tag: 'default' };
  if (typeof verdict === 'string') return { tag: verdict };
  return verdict;
}

export function sign(ctx, secrets, req) {
  return guard('sign', () => plugin().sign(ctx, secrets, req));
}
