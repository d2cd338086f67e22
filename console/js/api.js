// The admin API client: the admin token kept in sessionStorage (this tab
// only, gone when it closes; never in a URL or a cookie, so no other site
// can make the browser send it), sent as "Authorization: Bearer".
//
// A session ends when the API refuses the token (401: a wrong token, one
// rotated on the server, an expired admin JWT) or after IDLE_MS without
// any activity in the tab.

const TOKEN = "weir.console.token";
const ACTIVE = "weir.console.active";
export const IDLE_MS = 30 * 60 * 1000;

export class AuthError extends Error {}

export class ApiError extends Error {
  constructor(status, body) {
    const e = body && body.error;
    super(e && typeof e.message === "string" ? e.message : `HTTP ${status}`);
    this.status = status;
    this.param = e && e.param;
    this.code = e && e.code;
  }
}

let onSessionEnd = () => {};
// Counts sign-ins and session ends: an answer to a call made in an earlier session is never acted on (api(),
// and callers that await more than one call before they show anything compare sessionGeneration()).
let generation = 0;
export function sessionGeneration() {
  return generation;
}
// fn(message): called once when the session ends (the token is gone by then).
export function setSessionEndHandler(fn) {
  onSessionEnd = fn;
}

export function token() {
  return sessionStorage.getItem(TOKEN);
}

// Whether a token is stored and was used recently enough; drops a stale one.
export function sessionAlive() {
  if (!token()) return false;
  const last = Number(sessionStorage.getItem(ACTIVE) || 0);
  if (Date.now() - last > IDLE_MS) {
    endSession("Your session expired after 30 minutes without activity. Sign in again.");
    return false;
  }
  return true;
}

export function touch() {
  if (token()) sessionStorage.setItem(ACTIVE, String(Date.now()));
}

export function endSession(message) {
  const had = token() !== null;
  generation += 1;
  sessionStorage.removeItem(TOKEN);
  sessionStorage.removeItem(ACTIVE);
  if (had) onSessionEnd(message);
}

async function send(method, path, body, bearer) {
  const headers = {Authorization: `Bearer ${bearer}`};
  const init = {method, headers, cache: "no-store", credentials: "omit", redirect: "error"};
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, {error: {message: `The admin API cannot be reached (${e.message}).`}});
  }
  const type = res.headers.get("content-type") || "";
  const data = type.startsWith("application/json") ? await res.text().then(parseAnswer).catch(() => null) : await res.text();
  return {res, data};
}

// Whether this browser parses and writes numbers as their JSON text (JSON.parse's source text access and
// JSON.rawJSON: Chromium 114, Firefox 135, Safari 18.4); without it, an integer beyond 2^53 (a key's metadata
// holds int64s exactly) cannot be shown or sent exactly, and the console says so instead (keys.js).
export const EXACT_NUMBERS = typeof JSON.rawJSON === "function" &&
  JSON.parse("1", (k, v, ctx) => ctx !== undefined && ctx.source === "1");

// An answer's JSON with every integer a double cannot hold (|n| > 2^53 - 1: metadata's ids) kept as its text
// (a JSON.rawJSON value: JSON.stringify writes it back as it came, text() shows it as it is).
function parseAnswer(s) {
  if (!EXACT_NUMBERS) return JSON.parse(s);
  return JSON.parse(s, (k, v, ctx) =>
    typeof v === "number" && Number.isInteger(v) && !Number.isSafeInteger(v) ? JSON.rawJSON(ctx.source) : v);
}

// JSON text an operator typed (a key's metadata), parsed with every number kept as typed (a JSON.rawJSON
// value), so that sending it sends the operator's digits: 9007199254740993 stays itself, not the double
// ...992, and 1e400 is refused by the API rather than sent as null. Throws SyntaxError as JSON.parse does; a
// text with an integer beyond 2^53 throws RangeError where the browser cannot keep it (EXACT_NUMBERS false).
export function parseTyped(s) {
  if (EXACT_NUMBERS) return JSON.parse(s, (k, v, ctx) => (typeof v === "number" ? JSON.rawJSON(ctx.source) : v));
  return JSON.parse(s, (k, v) => {
    if (typeof v === "number" && (!Number.isFinite(v) || (Number.isInteger(v) && !Number.isSafeInteger(v))))
      throw new RangeError(`${v} cannot be sent exactly from this browser (integers up to 2^53 - 1 only); ` +
        "use a newer browser, or the admin API directly");
    return v;
  });
}

// Whether `v` (a parsed answer) holds an integer this browser shows rounded (EXACT_NUMBERS false).
export function holdsRoundedInteger(v) {
  if (typeof v === "number") return Number.isInteger(v) && !Number.isSafeInteger(v);
  if (v && typeof v === "object") return Object.values(v).some(holdsRoundedInteger);
  return false;
}

// Signs in: checks `candidate` against the API before keeping it.
export async function login(candidate) {
  // A bearer credential is visible ASCII (RFC 6750 b64token; an admin JWT is base64url): a character outside it
  // (an en dash or a no-break space a paste brought in) cannot go in the Authorization field at all, and the
  // browser's fetch refuses it before any request, which would read as a network failure.
  const bad = [...candidate].find((c) => c < "!" || c > "~");
  if (bad !== undefined) {
    const code = bad.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    throw new ApiError(0, {error: {message: `The token holds a character no token has (U+${code}): ` +
      "type it, or paste it again without that character."}});
  }
  const {res, data} = await send("GET", "/admin/v1/tenants", undefined, candidate);
  if (res.status === 401) throw new ApiError(401, data);
  if (!res.ok) throw new ApiError(res.status, data);
  generation += 1;
  sessionStorage.setItem(TOKEN, candidate);
  touch();
}

// One API call with the session's token. Throws AuthError (and ends the
// session) on 401, ApiError on any other non-2xx answer; AuthError too when
// the session ended (or another began) while the call was in flight: its
// answer (a new key's secret) is for no one on screen now.
export async function api(method, path, body) {
  if (!sessionAlive()) throw new AuthError("signed out");
  const gen = generation;
  const {res, data} = await send(method, path, body, token());
  if (gen !== generation) throw new AuthError("signed out");
  if (res.status === 401) {
    const why = data && data.error && typeof data.error.message === "string" ? data.error.message : "401";
    endSession(`Your session ended: the admin API refused the token (${why}). Sign in again.`);
    throw new AuthError(why);
  }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export const get = (path) => api("GET", path);

// "/admin/v1/keys/" + id, with the id as one path segment.
export function seg(s) {
  return encodeURIComponent(String(s));
}
