// world herald:plugin/plugin@0.1.0
export type DeliveryContext = import('./interfaces/herald-plugin-types.js').DeliveryContext;
export type Request = import('./interfaces/herald-plugin-types.js').Request;
export type TransformResult = import('./interfaces/herald-plugin-types.js').TransformResult;
export type Outcome = import('./interfaces/herald-plugin-types.js').Outcome;
export type Verdict = import('./interfaces/herald-plugin-types.js').Verdict;
export type Header = import('./interfaces/herald-plugin-types.js').Header;
export type Error = import('./interfaces/herald-plugin-types.js').Error;
export type PluginInfo = import('./interfaces/herald-plugin-types.js').PluginInfo;
export type * as HeraldPluginHost010 from './interfaces/herald-plugin-host.js'; // import herald:plugin/host@0.1.0
export type * as HeraldPluginTypes010 from './interfaces/herald-plugin-types.js'; // import herald:plugin/types@0.1.0
/**
* Describe the plugin: name, version and the hooks it implements. Called once
* when the plugin is loaded; must not trap.
*/
export function describe(): PluginInfo;
/**
* Reshape the request's body and headers before it is signed and sent, or drop
* the delivery. An `error` fails the attempt (it is retried per policy).
*/
export function transform(ctx: DeliveryContext, req: Request): TransformResult;
/**
* Decide what an attempt's outcome means. Return `default` to defer to Herald's
* built-in table.
*/
export function classify(ctx: DeliveryContext, outcome: Outcome): Verdict;
/**
* Compute signature headers for the final request, replacing Herald's built-in
* Standard Webhooks signature. `secrets` holds the raw key bytes of every valid
* signing secret of the endpoint, newest first (more than one during rotation).
* The returned headers are added to the request, replacing same-named ones.
*/
export function sign(ctx: DeliveryContext, secrets: Array<Uint8Array>, req: Request): Array<Header>;
