// The /v1 API with the user's token, and small DOM helpers shared by the viewer's modules.
// Text is always set with textContent: ids and messages are data.

const TOKEN_KEY = "appliance.token";

export class ApiError extends Error {
  /** status 0: the appliance did not answer (down, restarting, network). */
  constructor(status, message, retryAfterS = null) {
    super(message);
    this.status = status;
    this.retryAfterS = retryAfterS;
  }
}

// Roles, lowest first: each may do what the ones before it may (docs/security.md).
const ROLES = ["viewer", "operator", "admin"];

export const auth = {
  token: sessionStorage.getItem(TOKEN_KEY),
  role: null, // the token's role, from GET /v1/me; null until known
  onUnauthorized: (_reason) => {}, // set by the page: show the token form
  onRole: (_role) => {}, // set by the page: show what the role may do
  set(token) {
    this.token = token;
    this.role = null;
    sessionStorage.setItem(TOKEN_KEY, token);
  },
  /** Whether the token may do what `role` may: the page offers only that. */
  can(role) {
    return this.role !== null && ROLES.indexOf(this.role) >= ROLES.indexOf(role);
  },
  /** Ask the appliance who the token is (GET /v1/me), then tell the page. */
  async refreshRole() {
    const me = await (await api("GET", "/v1/me")).json();
    if (me.role !== this.role) {
      this.role = me.role;
      this.onRole(me.role);
    }
  },
};

export async function api(method, path, body, extra = {}) {
  const headers = auth.token ? { Authorization: `Bearer ${auth.token}` } : {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const init = { method, headers, cache: "no-store", ...extra };
  if (body !== undefined) init.body = JSON.stringify(body);
  let resp;
  try {
    resp = await fetch(path, init);
  } catch {
    throw new ApiError(0, "the appliance does not answer");
  }
  if (resp.status === 401) {
    auth.onUnauthorized(auth.token ? "The appliance refused this token (401): enter it again."
      : "This appliance needs its API token.");
    throw new ApiError(401, "unauthorized");
  }
  if (!resp.ok) {
    const detail = await resp.json().catch(() => null);
    const retry = Number(resp.headers.get("Retry-After")) || null;
    throw new ApiError(resp.status, detail?.error?.message ?? resp.statusText, retry);
  }
  return resp;
}

export const apiJson = async (method, path, body) => (await api(method, path, body)).json();

export const $ = (id) => document.getElementById(id);
export const say = (id, text) => { $(id).textContent = text; };

export function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

export const streamPath = (id) => `/v1/streams/${encodeURIComponent(id)}`;

/** What a stream's state means for someone looking at its video, in a sentence. */
export function stateText(stream) {
  const error = stream.last_error_cleared ? null : stream.last_error; // a past one: not why
  const why = error ?? stream.transitions?.at(-1)?.reason ?? "";
  const because = why ? `: ${why}` : ".";
  switch (stream.state) {
    case "running": return "";
    case "starting": return "The stream is starting…";
    case "reconnecting": return `The camera is reconnecting${because}`;
    case "stalled": return `The stream has stalled${because}`;
    case "failed": return `The stream has failed${because}`;
    default: return `The stream is ${stream.state}${because}`;
  }
}
