/** @module Interface herald:plugin/types@0.1.0 **/
/**
 * One HTTP header as (name, value). Names are case-insensitive HTTP tokens; values
 * must be visible ASCII or spaces (no tabs, CR/LF or other bytes: such output is
 * refused as invalid). A hook returns at most 64 headers.
 */
export type Header = [string, string];
/**
 * A human-readable error message returned by a hook that could not do its job.
 * Herald records it and fails the attempt with `plugin:error: <message>`.
 */
export type Error = string;
/**
 * What Herald knows about the delivery attempt the hook runs for. This is the
 * plugin's only source of time and identity.
 */
export interface DeliveryContext {
  /**
   * The tenant that owns the endpoint and the plugin (a slug).
   */
  tenant: string,
  /**
   * The endpoint id (`ep_…`).
   */
  endpointId: string,
  /**
   * The event id (`evt_…`); stable across attempts and replays.
   */
  eventId: string,
  /**
   * The event type, e.g. `invoice.paid`.
   */
  eventType: string,
  /**
   * The attempt number, starting at 1.
   */
  attempt: number,
  /**
   * The attempt's start time, in whole seconds since the Unix epoch.
   */
  timestamp: bigint,
  /**
   * A fresh id for this attempt; never reused.
   */
  attemptId: string,
}
/**
 * An outgoing webhook request. The destination (method, URL) is fixed by the
 * endpoint and cannot be changed by a plugin.
 */
export interface Request {
  /**
   * Headers Herald will send (content-type and custom endpoint headers
   * included; signature headers are added after `transform`).
   */
  headers: Array<Header>,
  /**
   * The body bytes, by default Herald's JSON envelope
   * `{"id", "type", "timestamp", "data"}`.
   */
  body: Uint8Array,
}
/**
 * What `transform` decided.
 */
export type TransformResult = TransformResultSend | TransformResultDrop;
/**
 * Send this (possibly reshaped) request.
 */
export interface TransformResultSend {
  tag: 'send',
  val: Request,
}
/**
 * Do not deliver this event to this endpoint; the delivery is recorded as
 * dropped with this reason and never retried.
 */
export interface TransformResultDrop {
  tag: 'drop',
  val: string,
}
/**
 * The response a receiver gave to an attempt.
 */
export interface Response {
  /**
   * The HTTP status code.
   */
  status: number,
  /**
   * The response headers.
   */
  headers: Array<Header>,
  /**
   * At most the first 1 KiB of the response body.
   */
  body: Uint8Array,
}
/**
 * Why an attempt got no HTTP response at all.
 * # Variants
 * 
 * ## `"timeout"`
 * 
 * The connect or total deadline passed.
 * ## `"connection-refused"`
 * 
 * The connection was refused.
 * ## `"connection-reset"`
 * 
 * The connection was reset or closed before a response.
 * ## `"dns"`
 * 
 * The host name did not resolve.
 * ## `"tls"`
 * 
 * TLS failed (for example an invalid certificate).
 * ## `"other"`
 * 
 * Any other transport failure.
 */
export type TransportErrorKind = 'timeout' | 'connection-refused' | 'connection-reset' | 'dns' | 'tls' | 'other';
/**
 * An attempt that got no HTTP response.
 */
export interface TransportError {
  /**
   * The kind of failure.
   */
  kind: TransportErrorKind,
  /**
   * Herald's description of it, for humans.
   */
  message: string,
}
/**
 * How an attempt ended, as seen by `classify`.
 */
export type Outcome = OutcomeResponse | OutcomeTransportError;
/**
 * The receiver answered.
 */
export interface OutcomeResponse {
  tag: 'response',
  val: Response,
}
/**
 * No response was received.
 */
export interface OutcomeTransportError {
  tag: 'transport-error',
  val: TransportError,
}
/**
 * A request to pause the endpoint.
 */
export interface Pause {
  /**
   * How long to pause the whole endpoint, in seconds (at most 7 days).
   */
  secs: number,
  /**
   * Why; shown to operators and the tenant.
   */
  reason: string,
}
/**
 * What `classify` decided about an attempt.
 */
export type Verdict = VerdictDelivered | VerdictRetry | VerdictFail | VerdictPauseEndpoint | VerdictDisableEndpoint | VerdictDefault;
/**
 * The receiver has the event; stop.
 */
export interface VerdictDelivered {
  tag: 'delivered',
}
/**
 * Try again: after this many seconds when given (still bounded by the
 * event's deadline), else after the endpoint's backoff delay.
 */
export interface VerdictRetry {
  tag: 'retry',
  val: number | undefined,
}
/**
 * Permanent failure: dead-letter the delivery with this reason.
 */
export interface VerdictFail {
  tag: 'fail',
  val: string,
}
/**
 * Pause the whole endpoint and retry this delivery afterwards.
 */
export interface VerdictPauseEndpoint {
  tag: 'pause-endpoint',
  val: Pause,
}
/**
 * Disable the endpoint (its queued deliveries are dead-lettered).
 */
export interface VerdictDisableEndpoint {
  tag: 'disable-endpoint',
  val: string,
}
/**
 * No opinion: use Herald's built-in response table.
 */
export interface VerdictDefault {
  tag: 'default',
}
/**
 * Which hooks a plugin implements.
 */
export interface Hooks {
  /**
   * `transform` reshapes or drops requests.
   */
  transform?: boolean,
  /**
   * `classify` decides what a response means.
   */
  classify?: boolean,
  /**
   * `sign` computes signature headers.
   */
  sign?: boolean,
}
/**
 * What a plugin says about itself.
 */
export interface PluginInfo {
  /**
   * The plugin's own name (informational; Herald addresses it by file name).
   */
  name: string,
  /**
   * The plugin's own version (informational).
   */
  version: string,
  /**
   * The hooks Herald may call.
   */
  hooks: Hooks,
  /**
   * The response statuses `classify` has an opinion on. `none`: it is called for
   * every outcome. `some(statuses)`: only for responses with one of these statuses
   * and for transport errors; any other response goes straight to the built-in
   * table, as if `classify` had returned `default`, without a call.
   */
  classifyStatuses?: Uint16Array,
}
/**
 * Severity of a log line.
 * # Variants
 * 
 * ## `"trace"`
 * 
 * ## `"debug"`
 * 
 * ## `"info"`
 * 
 * ## `"warn"`
 * 
 * ## `"error"`
 */
export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';
