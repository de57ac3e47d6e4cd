// Herald's JavaScript runtime: one component (built by scripts/build-js-runtime with
// componentize-js, world `herald:plugin/js-runtime` of wit/js.wit) that exports the
// `herald:plugin` hooks and runs them by evaluating a tenant's plugin source, read from the
// `js-source` import once per instance. What a plugin sees: plugin-host.js.
import { source, maxOutputBytes } from 'herald:plugin/js-source@0.1.0';
import { fail } from 'herald:plugin/js-failure@0.1.0';
import { log, getConfig } from 'herald:plugin/host@0.1.0';
import { evaluate, HookFailure } from './plugin-host.js';

const decoder = new TextDecoder();
const encoder = new TextEncoder();
const host = { log, getConfig, decode: (bytes) => decoder.decode(bytes), encode: (text) => encoder.encode(text) };
let plugin = null;

function loaded() {
  if (plugin === null) {
    host.maxOutputBytes = maxOutputBytes();
    plugin = evaluate(source(), host);
  }
  return plugin;
}

// A HookFailure is handed to Herald through `fail`, which ends the call there; anything
// else thrown is a hook's `error` result (transform, sign) or a bug of this runtime.
function guarded(hook) {
  return (...args) => {
    try {
      return hook(...args);
    } catch (e) {
      if (e instanceof HookFailure) fail(e.kind, e.message);
      throw e;
    }
  };
}

export const describe = guarded(() => loaded().describe());
export const transform = guarded((ctx, req) => loaded().transform(ctx, req));
export const classify = guarded((ctx, outcome) => loaded().classify(ctx, outcome));
export const sign = guarded((ctx, secrets, req) => loaded().sign(ctx, secrets, req));
