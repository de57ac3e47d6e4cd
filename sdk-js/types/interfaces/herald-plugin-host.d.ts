/** @module Interface herald:plugin/host@0.1.0 **/
/**
 * Write a log line to Herald's structured log, tagged with the tenant, plugin
 * and attempt. Lines past 1 KiB are truncated; at most 32 lines per call are kept.
 */
export function log(level: Level, message: string): void;
/**
 * Read a key of this plugin's configuration: the string map operators set for
 * this (tenant, plugin) in Herald's TOML `[plugins.config]`. None when unset.
 */
export function getConfig(key: string): string | undefined;
export type Level = import('./herald-plugin-types.js').Level;
