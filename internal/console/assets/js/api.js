// The console's one way to the API: the same REST routes the SDKs use,
// authenticated by the HttpOnly session cookie (the page never holds the
// API key), with the session's CSRF token on every change.

let csrfToken = '';
let onSignedOut = () => {};

/** An error the API answered, with its HTTP status. */
export class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** Sets what to do when the session ends (a 401 from anything). */
export function whenSignedOut(fn) { onSignedOut = fn; }

/** Calls the API: method, path (from the server's root) and a JSON body. */
export async function api(method, path, body) {
  return (await apiWithHeaders(method, path, body)).data;
}

/** As api, with the answer's headers too: {data, headers}. */
export async function apiWithHeaders(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = csrfToken;
  const opts = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  if (!res.ok) {
    let message = res.statusText;
    try { message = (await res.json()).message || message; } catch { /* not JSON */ }
    if (res.status === 401 && !path.startsWith('/console/session')) onSignedOut();
    throw new APIError(res.status, message);
  }
  if (res.status === 204) return { data: null, headers: res.headers };
  const type = res.headers.get('Content-Type') || '';
  return { data: await (type.includes('json') ? res.json() : res.text()), headers: res.headers };
}

/** Sends bytes (a File or Blob) as a request's body, CSRF token included. */
export async function sendBytes(method, path, blob) {
  const res = await fetch(path, {
    method,
    headers: { Accept: 'application/json', 'Content-Type': 'application/octet-stream', 'X-CSRF-Token': csrfToken },
    credentials: 'same-origin',
    cache: 'no-store',
    body: blob,
  });
  if (!res.ok) {
    let message = res.statusText;
    try { message = (await res.json()).message || message; } catch { /* not JSON */ }
    if (res.status === 401) onSignedOut();
    throw new APIError(res.status, message);
  }
}

/** The session's CSRF token, for what cannot carry a header (a WebSocket's URL). */
export function csrf() { return csrfToken; }

/** The current session ({key, csrfToken, expiresAt}), or null. */
export async function currentSession() {
  try {
    const s = await api('GET', '/console/session');
    csrfToken = s.csrfToken;
    return s;
  } catch (e) {
    if (e.status === 401) return null;
    throw e;
  }
}

/** Signs in with an API key; the key goes to the server only. */
export async function signIn(apiKey) {
  const s = await api('POST', '/console/session', { apiKey });
  csrfToken = s.csrfToken;
  return s;
}

/** Signs out: the server clears the cookie. */
export async function signOut() {
  await api('DELETE', '/console/session');
  csrfToken = '';
}
