// What a Herald JavaScript plugin sees, for editors and TypeScript. The data types are
// generated from wit/ by `jco types` into types/ (scripts/build-js-runtime checks they
// are current); this file adds the globals and the hook signatures of plugin-host.js.
//
// In a plugin: `/// <reference path="./herald/herald.d.ts" />`, then e.g.
// `/** @type {import('./herald/herald').Transform} */ function transform(ctx, req) { … }`.
import type {
  DeliveryContext,
  Header,
  Outcome,
  PluginInfo,
  Request,
  TransformResult,
  Verdict,
} from './types/plugin.js';
import type { Level } from './types/interfaces/herald-plugin-types.js';

export type { DeliveryContext, Header, Outcome, PluginInfo, Request, TransformResult, Verdict, Level };

/** A request a hook returns: its body a `Uint8Array`, or a string (sent as UTF-8). */
export interface OutgoingRequest {
  headers: Header[];
  body: Uint8Array | string;
}
/**
 * `transform`: `{ tag: 'send', val }`, `{ tag: 'drop', val: reason }`, or a bare request
 * (sent). Throw to fail the attempt (`plugin:error`); anything else, nothing included, fails
 * it as `plugin:invalid_output`, naming the field.
 */
export type Transform = (
  ctx: DeliveryContext,
  req: Request,
) => { tag: 'send'; val: OutgoingRequest } | { tag: 'drop'; val: string } | OutgoingRequest;
/**
 * `classify`: a verdict, a bare tag such as `'delivered'`, or nothing (the built-in table).
 * A throw, or a verdict its type cannot hold, falls back to the built-in table and is
 * counted as the plugin's failure.
 */
export type Classify = (ctx: DeliveryContext, outcome: Outcome) => Verdict | Verdict['tag'] | null | undefined;
/** `sign`: the headers to set. Throw to fail the attempt. */
export type Sign = (ctx: DeliveryContext, secrets: Uint8Array[], req: Request) => Header[];
/** The optional top-level `plugin` object (else `describe` is derived from the hooks defined). */
export interface PluginMeta {
  name?: string;
  version?: string;
  /** Only these response statuses (and transport errors) reach `classify`. */
  classifyStatuses?: number[];
}

declare global {
  /** Herald's host functions. */
  const herald: {
    /** A line in Herald's log, tagged with tenant, plugin and attempt (1 KiB, 32 lines a call). Not a string: JSON. */
    log(level: Level, message: unknown): void;
    /** This plugin's configuration value for `key`. */
    config(key: string): string | undefined;
    /** UTF-8 text of bytes (a body). */
    text(bytes: Uint8Array): string;
    /** UTF-8 bytes of text. */
    bytes(text: string): Uint8Array;
  };
}
