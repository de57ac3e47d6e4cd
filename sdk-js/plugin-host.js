// How Herald runs a JavaScript plugin, shared by the runtime component (runtime.js, inside
// Herald) and the test helper (testing.mjs, under node), so a plugin behaves the same in
// both: the same evaluation, the same conversion of what a hook returns, the same refusals.
// No imports: the caller passes in what the plugin may reach (`host`).
//
// A plugin is a script that defines any of the top-level functions `transform`,
// `classify` and `sign`, and optionally a top-level `plugin` object (`name`, `version`,
// `classifyStatuses`) or its own `describe()`. It sees the JS built-ins, a `console` that
// writes to Herald's log (objects as JSON), and `herald`: `log(level, message)`,
// `config(key)`, `text(bytes)`, `bytes(text)`. Data follows the WIT as types/ shows it:
// records are objects with camelCase fields, `list<u8>` is a Uint8Array (a body may also
// be returned as a string, sent as UTF-8, or as any other view of bytes: a typed array, a
// DataView or an ArrayBuffer, of any realm), variants are `{ tag, val }`.
//
// What a hook returns is checked here, field by field, before it is handed to Herald: a
// value its WIT type cannot hold is refused with a HookFailure naming the field, which
// Herald records as `plugin:invalid_output: <message>` (converted blindly, a string body
// became an empty one and a number trapped the call).

const HOOKS = ['transform', 'classify', 'sign'];
const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];
const VERDICTS = ['delivered', 'retry', 'fail', 'pause-endpoint', 'disable-endpoint', 'default'];
/** What the plugin's source is compiled after, as the body of a function of `herald` and `console`. */
const PRELUDE = '"use strict";\n';

/**
 * A hook call that failed in a way its WIT type cannot return. `kind` is `invalid-output`
 * (the hook returned something Herald cannot use) or `error` (the source did not evaluate,
 * or a hook without an error result threw); `reason` is what Herald records.
 */
export class HookFailure extends Error {
  constructor(kind, message) {
    super(message);
    this.name = 'HookFailure';
    this.kind = kind;
    const reason = `plugin:${kind.replaceAll('-', '_')}`;
    // Herald records an output over its cap without a message, as it does a component's.
    this.reason = kind === 'output-too-large' ? reason : `${reason}: ${message}`;
  }
}

/** The error text of anything thrown, with where in the plugin it was thrown when the engine says. */
export function messageOf(e) {
  if (!(e instanceof Error)) return show(e);
  const at = thrownAt(e);
  return `${e.name}: ${e.message}${at ? ` (${at})` : ''}`;
}

/** How a value is written to the log: strings as they are, anything else as JSON when it can be. */
export function show(value) {
  if (typeof value === 'string') return value;
  if (typeof value === 'bigint') return value.toString();
  if (value instanceof Error) return messageOf(value);
  try {
    return JSON.stringify(value, jsonable) ?? String(value);
  } catch {
    return String(value);
  }
}

/**
 * Evaluates `source` once and returns its hooks, given `host`:
 * `{ log(level, message), getConfig(key) }`, `decode(bytes)`, `encode(text)`, and
 * `maxOutputBytes`, Herald's output cap (none when undefined).
 * Every hook returns what its WIT type holds, or throws: a string (the `error` result of
 * `transform` and `sign`) or a HookFailure.
 */
export function evaluate(source, host) {
  const herald = {
    log: (level, message) => host.log(LEVELS.includes(level) ? level : 'info', show(message)),
    config: (key) => host.getConfig(String(key)),
    text: (bytes) => host.decode(bytes),
    bytes: (text) => host.encode(String(text)),
  };
  const line = (level) => (...args) => herald.log(level, args.map(show).join(' '));
  const console = { log: line('info'), info: line('info'), debug: line('debug'), warn: line('warn'), error: line('error') };
  const names = [...HOOKS, 'describe', 'plugin'];
  const pick = names.map((n) => `typeof ${n} === 'undefined' ? undefined : ${n}`).join(', ');
  let compiled;
  try {
    compiled = new Function('herald', 'console', `${PRELUDE}${source}\n;return [${pick}];`);
  } catch (e) {
    throw new HookFailure('error', syntaxError(e, source));
  }
  let values;
  try {
    values = compiled(herald, console);
  } catch (e) {
    throw new HookFailure('error', `evaluating the source threw ${messageOf(e)}`);
  }
  const p = Object.fromEntries(names.map((n, i) => [n, values[i]]));
  return {
    describe: () => describe(p),
    transform: (ctx, req) => transformResult(asError(() => p.transform(ctx, req)), host),
    classify: (ctx, outcome) => verdictOf(thrown('classify', () => p.classify(ctx, outcome))),
    sign: (ctx, secrets, req) => headersOf(asError(() => p.sign(ctx, secrets, req)), 'sign: the result'),
  };
}

function describe(p) {
  if (typeof p.describe === 'function') return pluginInfo(thrown('describe', () => p.describe()), 'describe: the result');
  const meta = p.plugin ?? {};
  const hooks = {};
  for (const h of HOOKS) hooks[h] = typeof p[h] === 'function';
  if (!HOOKS.some((h) => hooks[h])) {
    throw new HookFailure('error', 'the source defines none of the functions transform, classify, sign');
  }
  const info = { name: meta.name ?? 'js', version: meta.version ?? '0.0.0', hooks, classifyStatuses: meta.classifyStatuses };
  return pluginInfo(info, 'plugin');
}

// A `result` export: what the plugin throws becomes the `error` string.
function asError(f) {
  try {
    return f();
  } catch (e) {
    throw messageOf(e);
  }
}

// An export without an `error` result: what the plugin throws fails the call.
function thrown(hook, f) {
  try {
    return f();
  } catch (e) {
    throw new HookFailure('error', `${hook}: ${messageOf(e)}`);
  }
}

function invalid(message) {
  return new HookFailure('invalid-output', message);
}

// `{ tag: 'send' | 'drop', val }`, or a bare request (sent).
function transformResult(out, host) {
  const shape = "{ tag: 'send', val: request }, { tag: 'drop', val: reason } or a request { headers, body }";
  if (!isObject(out)) throw invalid(`transform: the result must be ${shape}, got ${kindOf(out)}`);
  if (out.tag === 'drop') {
    if (typeof out.val !== 'string') throw invalid(`transform: the drop reason (val) must be a string, got ${kindOf(out.val)}`);
    return { tag: 'drop', val: out.val };
  }
  if (out.tag === 'send') return { tag: 'send', val: requestOf(out.val, 'transform: request', host) };
  if (out.tag !== undefined) throw invalid(`transform: the result's tag must be 'send' or 'drop', got ${kindOf(out.tag)}`);
  return { tag: 'send', val: requestOf(out, 'transform: request', host) };
}

// A request whose body is a string (UTF-8) or bytes.
function requestOf(req, field, host) {
  if (!isObject(req)) throw invalid(`${field} must be { headers, body }, got ${kindOf(req)}`);
  const headers = headersOf(req.headers, `${field}.headers`);
  return { headers, body: bytesOf(req.body, `${field}.body`, host) };
}

// A body as the Uint8Array Herald sends: a string's UTF-8, or the bytes of a Uint8Array,
// any other typed array or DataView, or an ArrayBuffer. Of any realm: `instanceof` is not
// asked, as the runtime's own bindings hand `req.body` over as a Uint8Array of another
// realm (passing it through was refused as "got Uint8Array"). Over the output cap is
// refused before anything is copied or encoded: a string's UTF-8 has at least one byte a
// UTF-16 unit, and encoding 8 MiB took longer than a call's whole budget.
function bytesOf(body, field, host) {
  const cap = host.maxOutputBytes;
  const over = (size, what) => {
    if (cap !== undefined && size > cap) {
      throw new HookFailure('output-too-large', `${field} is ${what} of ${size}, over the output cap of ${cap} bytes`);
    }
  };
  if (typeof body === 'string') {
    over(body.length, 'a string of UTF-16 units');
    return host.encode(body);
  }
  let bytes;
  if (body instanceof Uint8Array) bytes = body;
  else if (ArrayBuffer.isView(body)) bytes = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  else if (['[object ArrayBuffer]', '[object SharedArrayBuffer]'].includes(Object.prototype.toString.call(body))) {
    bytes = new Uint8Array(body);
  } else {
    throw invalid(`${field} must be a string or bytes (a Uint8Array, another typed array, a DataView or an ArrayBuffer), got ${kindOf(body)}`);
  }
  over(bytes.byteLength, 'bytes');
  return bytes;
}

// A list of [name, value] pairs of strings.
function headersOf(headers, field) {
  if (!Array.isArray(headers)) throw invalid(`${field} must be a list of [name, value] pairs, got ${kindOf(headers)}`);
  headers.forEach((pair, i) => {
    const ok = Array.isArray(pair) && pair.length === 2 && typeof pair[0] === 'string' && typeof pair[1] === 'string';
    const got = Array.isArray(pair) ? `[${pair.map((v) => (v === null ? 'null' : typeof v)).join(', ')}]` : kindOf(pair);
    if (!ok) throw invalid(`${field}[${i}] must be a [name, value] pair of strings, got ${got}`);
  });
  return headers;
}

// A verdict, a bare tag such as 'delivered', or nothing (the built-in table).
function verdictOf(verdict) {
  if (verdict === null || verdict === undefined) return { tag: 'default' };
  const v = typeof verdict === 'string' ? { tag: verdict } : verdict;
  if (!isObject(v)) throw invalid(`classify: the verdict must be a tag such as 'delivered' or { tag, val }, got ${kindOf(verdict)}`);
  const field = `classify: ${v.tag}'s val`;
  switch (v.tag) {
    case 'retry':
      if (v.val === undefined || v.val === null) return { tag: 'retry', val: undefined };
      return { tag: 'retry', val: whole(v.val, 0xffff_ffff, `${field} (seconds to wait, or nothing)`) };
    case 'fail':
    case 'disable-endpoint':
      if (typeof v.val !== 'string') throw invalid(`${field} (the reason) must be a string, got ${kindOf(v.val)}`);
      return { tag: v.tag, val: v.val };
    case 'pause-endpoint': {
      if (!isObject(v.val)) throw invalid(`${field} must be { secs, reason }, got ${kindOf(v.val)}`);
      const secs = whole(v.val.secs, 0xffff_ffff, `${field}.secs`);
      if (typeof v.val.reason !== 'string') throw invalid(`${field}.reason must be a string, got ${kindOf(v.val.reason)}`);
      return { tag: v.tag, val: { secs, reason: v.val.reason } };
    }
    case 'delivered':
    case 'default':
      return { tag: v.tag };
    default:
      throw invalid(`classify: the verdict's tag must be one of ${VERDICTS.map((t) => `'${t}'`).join(', ')}, got ${kindOf(v.tag)}`);
  }
}

// What `describe` says: names, the hooks, and the statuses `classify` wants.
function pluginInfo(info, field) {
  if (!isObject(info)) throw invalid(`${field} must be { name, version, hooks, classifyStatuses }, got ${kindOf(info)}`);
  for (const key of ['name', 'version']) {
    if (typeof info[key] !== 'string') throw invalid(`${field}.${key} must be a string, got ${kindOf(info[key])}`);
  }
  if (!isObject(info.hooks)) throw invalid(`${field}.hooks must be { transform, classify, sign }, got ${kindOf(info.hooks)}`);
  const hooks = Object.fromEntries(HOOKS.map((h) => [h, Boolean(info.hooks[h])]));
  const [name, version] = [cut(info.name), cut(info.version)];
  const statuses = info.classifyStatuses;
  if (statuses === undefined || statuses === null) return { name, version, hooks, classifyStatuses: undefined };
  if (!Array.isArray(statuses)) throw invalid(`${field}.classifyStatuses must be a list of HTTP statuses, got ${kindOf(statuses)}`);
  const list = statuses.map((s, i) => whole(s, 0xffff, `${field}.classifyStatuses[${i}]`));
  return { name, version, hooks, classifyStatuses: list };
}

// A name or version as Herald keeps it: at most 128 bytes (cut here to 128 UTF-16 units,
// never inside a pair, and by Herald to 128 bytes), so an over-long one is cut, not
// refused (handing 8 MiB to Herald took longer than a call's budget).
const MAX_NAME = 128;
function cut(text) {
  if (text.length <= MAX_NAME) return text;
  const end = text.charCodeAt(MAX_NAME - 1) >= 0xd800 && text.charCodeAt(MAX_NAME - 1) <= 0xdbff ? MAX_NAME - 1 : MAX_NAME;
  return text.slice(0, end);
}

function whole(n, max, field) {
  if (Number.isInteger(n) && n >= 0 && n <= max) return n;
  throw invalid(`${field} must be a whole number from 0 to ${max}, got ${typeof n === 'number' ? n : kindOf(n)}`);
}

function isObject(v) {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** What a value is, for a refusal: its type, `null`, `array`, or the class of an object. */
function kindOf(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (typeof v === 'string') return v.length <= 40 ? `'${v}'` : 'a string';
  if (typeof v !== 'object') return typeof v;
  const name = Object.getPrototypeOf(v)?.constructor?.name;
  return name && name !== 'Object' ? name : 'object';
}

// JSON for the log: bigints as numbers' text, byte arrays as lists.
function jsonable(_key, value) {
  if (typeof value === 'bigint') return value.toString();
  if (ArrayBuffer.isView(value)) return Array.from(value);
  return value;
}

// Where the engine puts an error's position (SpiderMonkey, in Herald: `lineNumber` and
// `columnNumber` of a syntax error, and stack frames `…> Function:line:column` in the
// compiled source; node's V8 gives neither for `new Function`), counted from the
// plugin's own first line: the engine's line of the plugin's first is measured, not
// assumed, as engines wrap a function's body in lines of their own.
function syntaxError(e, source) {
  const text = `${e?.name ?? 'SyntaxError'}: ${e?.message ?? String(e)}`;
  const at = position(e?.lineNumber, e?.columnNumber);
  if (!at) return text;
  // Past the last line: the source ended inside something it opened.
  if (at.line > source.split('\n').length) return `${text} (at the end of the source)`;
  return `${text} (${where(at)})`;
}

function thrownAt(e) {
  const frame = /> Function:(\d+):(\d+)/.exec(String(e.stack ?? ''));
  const at = frame && position(Number(frame[1]), Number(frame[2]));
  return at ? where(at) : null;
}

function where({ line, column }) {
  return `line ${line}, column ${column}`;
}

function position(line, column) {
  if (!Number.isInteger(line) || !Number.isInteger(column)) return null;
  const first = firstLine();
  if (first === null || line < first.line) return null;
  return { line: line - first.line + 1, column: column - first.column + 1 };
}

let origin;
function firstLine() {
  if (origin !== undefined) return origin;
  try {
    new Function('herald', 'console', `${PRELUDE})`);
    origin = null;
  } catch (e) {
    origin = Number.isInteger(e.lineNumber) ? { line: e.lineNumber, column: e.columnNumber } : null;
  }
  return origin;
}
