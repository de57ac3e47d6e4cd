// Herald's JavaScript runtime: one component (built by scripts/build-js-runtime with
// componentize-js, world `herald:plugin/js-runtime` of wit/js.wit) that exports the
// `herald:plugin` hooks and runs them by evaluating a tenant's plugin source, read from the
// `js-source` import once per instance. What a plugin sees: plugin-host.js.
import { source } from 'herald:plugin/js-source@0.1.0';
import { log, getConfig } from 'herald:plugin/host@0.1.0';
import { evaluate } from './plugin-host.js';

const decoder = new TextDecoder();
const encoder = new TextEncoder();
const host = { log, getConfig, decode: (bytes) => decoder.decode(bytes), encode: (text) => encoder.encode(text) };
let plugin = null;

function loaded() {
  if (plugin === null) plugin = evaluate(source(), host);
  return plugin;
}

export const describe = () => loaded().describe();
export const transform = (ctx, req) => loaded().transform(ctx, req);
export const classify = (ctx, outcome) => loaded().classify(ctx, outcome);
export const sign = (ctx, secrets, req) => loaded().sign(ctx, secrets, req);
