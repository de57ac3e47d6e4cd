// The console's only way to act: the public API, with the session's token. The token lives
// in sessionStorage (this tab only, gone when it closes), never in a cookie or the URL.
// The customer portal (`/console/portal`) keeps its portal session's token there too.
const KEY = 'herald.console';

/** Whether this page is the customer portal (opened from a minted link). */
export function inPortal() {
  return location.pathname.replace(/\/$/, '') === '/console/portal';
}

/** The portal session's limits (`read_only`, `endpoints`, `plugins`), or null. */
export function portal() {
  return session()?.portal ?? null;
}

export function session() {
  try {
    return JSON.parse(sessionStorage.getItem(KEY));
  } catch {
    return null;
  }
}

export function saveSession(s) {
  sessionStorage.setItem(KEY, JSON.stringify(s));
}

export function clearSession() {
  sessionStorage.removeItem(KEY);
}

/** A refusal from the API: its status and `{error: {code, message}}`. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

/** Calls the API; `query` values that are empty are left out; `raw` sends bytes. */
export async function api(method, path, { body, query, raw, token } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, String(v));
  }
  const headers = { Authorization: `Bearer ${token ?? session()?.token ?? ''}` };
  let payload;
  if (raw !== undefined) {
    payload = raw;
    headers['content-type'] = 'application/octet-stream';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['content-type'] = 'application/json';
  }
  const r = await fetch(url, { method, headers, body: payload });
  const text = await r.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!r.ok) {
    const e = json?.error;
    throw new ApiError(r.status, e?.code ?? `http_${r.status}`, e?.message ?? text);
  }
  return json;
}

/** Whether the session's token may act with `scope` (`manage`, `replay`, …), as
 *  `GET /v1/whoami` said at sign-in: the console offers only what the API would allow. */
export function can(scope) {
  const s = session();
  if (s?.portal?.read_only && scope !== 'read') return false;
  return Boolean(s?.admin || s?.scopes?.includes(scope));
}

/** `/v1/tenants/{the session's tenant}` + `rest`. */
export function tenantPath(rest = '') {
  return `/v1/tenants/${encodeURIComponent(session()?.tenant ?? '')}${rest}`;
}
