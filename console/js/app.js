// The Weir console: a single page over the admin API (docs/console.md).
// Plain ES modules, no build step, no dependency: the pages are small and
// the server's CSP forbids anything but this origin's scripts.
// Routes live in the location's fragment (#/keys, #/requests?status=5xx),
// so the admin listener serves one page and nothing secret is in a URL.

import {endSession, sessionAlive, setSessionEndHandler, touch, login, ApiError} from "./api.js";
import {closeOverlays, h, mount} from "./dom.js";
import * as stats from "./stats.js";
import * as overview from "./pages/overview.js";
import * as tenants from "./pages/tenants.js";
import * as keys from "./pages/keys.js";
import * as requests from "./pages/requests.js";
import * as pools from "./pages/pools.js";

const PAGES = [
  {path: "overview", title: "Overview", page: overview},
  {path: "tenants", title: "Tenants & spend", page: tenants},
  {path: "keys", title: "Keys", page: keys},
  {path: "requests", title: "Requests", page: requests},
  {path: "pools", title: "Pools", page: pools},
];

const app = document.getElementById("app");
let cleanup = null;
let notice = null; // shown on the sign-in form once (why the session ended)

// "#/requests/abc?x=1" → {path: "requests", rest: ["abc"], query: URLSearchParams}
function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const q = raw.indexOf("?");
  const parts = (q < 0 ? raw : raw.slice(0, q)).split("/").filter(Boolean).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  return {path: parts[0] || "overview", rest: parts.slice(1), query: new URLSearchParams(q < 0 ? "" : raw.slice(q + 1))};
}

function render() {
  if (cleanup) cleanup();
  cleanup = null;
  if (!sessionAlive()) return renderLogin();
  stats.start();
  const r = route();
  const current = PAGES.find((p) => p.path === r.path) || PAGES[0];
  const main = h("main", {id: "main", tabindex: "-1"});
  const nav = h("nav", {class: "nav"},
    h("a", {class: "brand", href: "#/overview"}, "Weir"),
    h("ul", {}, PAGES.map((p) => h("li", {},
      h("a", {href: `#/${p.path}`, "aria-current": p === current ? "page" : null}, p.title)))),
    h("button", {type: "button", class: "link signout", on: {click: () => endSession(null)}}, "Sign out"));
  mount(app, nav, main);
  document.title = `${current.title} · Weir console`;
  cleanup = current.page.render(main, r) || null;
}

function renderLogin() {
  stats.stop();
  closeOverlays();
  const input = h("input", {type: "password", id: "token", name: "token", autocomplete: "off", spellcheck: "false",
    required: true, placeholder: "admin token"});
  const err = h("p", {class: "error", role: "alert", id: "login-error"});
  if (notice) err.textContent = notice; // kept until the next sign-in attempt
  const button = h("button", {type: "submit", class: "primary"}, "Sign in");
  const form = h("form", {class: "login", id: "login", on: {submit: async (e) => {
    e.preventDefault();
    button.disabled = true;
    err.textContent = "";
    notice = null;
    try {
      await login(input.value.trim());
      input.value = "";
      render();
    } catch (x) {
      err.textContent = x instanceof ApiError && x.status === 401
        ? `Sign-in refused: ${x.message}` : `Sign-in failed: ${x.message}`;
      button.disabled = false;
      input.select();
    }
  }}},
  h("h1", {}, "Weir console"),
  h("label", {for: "token"}, "Admin token"),
  input,
  h("p", {class: "hint"}, "The admin token (admin.token_env) or an admin JWT. It stays in this tab only and is sent to this server's admin API."),
  button,
  err);
  mount(app, form);
  document.title = "Sign in · Weir console";
  input.focus();
}

setSessionEndHandler((message) => {
  notice = message;
  closeOverlays(); // at once, whatever ended it (sign-out, idle, 401); renderLogin closes any opened since
  // Render on the next turn: the caller may still be unwinding a page.
  setTimeout(render, 0);
});

// Activity keeps the session alive; a timer ends it when the tab sits idle.
let lastTouch = 0;
for (const ev of ["keydown", "pointerdown"]) {
  addEventListener(ev, () => {
    const now = Date.now();
    if (now - lastTouch > 10000) {
      lastTouch = now;
      touch();
    }
  }, {capture: true, passive: true});
}
setInterval(() => sessionAlive(), 30000);

addEventListener("hashchange", render);
render();
