// Conveyor dashboard: live refresh and actions. No framework, no build step.
//
// Live: <main data-poll="/api/..."> names the JSON endpoint behind the page. While the tab is
// visible, this polls it; when the JSON changes (and once after the first answer), it
// fetches the page's content again (?partial=1) and swaps it in: no reload, and nothing is
// polled while nobody looks.
// Actions: <form class="action"> POSTs to an action endpoint with the operator's token (kept
// in this tab's session storage, sent in the X-Conveyor-Token header, never in a cookie).
// A read-only dashboard (<body class="read-only">) disables every action button, and again
// after each refresh: a button that cannot work must not look as if it could.
// After an action the content is fetched again; if what it showed is gone (a purged dead
// letter: 404), the page says so instead of keeping the old content and its buttons.
"use strict";

const POLL_MS = 2000;
const TOKEN_KEY = "conveyor-token";
let lastJson = null;
let timer = null;

function flash(text, ok) {
  const box = document.getElementById("flash");
  if (!box) return;
  box.textContent = text;
  box.className = ok ? "ok" : "bad";
  box.hidden = false;
}

function partialUrl() {
  const u = new URL(window.location.href);
  u.searchParams.set("partial", "1");
  return u.toString();
}

// Someone is typing in the content (a conf, a filter): swapping it now would lose that.
function typing(main) {
  const active = document.activeElement;
  if (main.contains(active) && ["INPUT", "SELECT", "TEXTAREA"].includes(active.tagName)) {
    return true;
  }
  return [...main.querySelectorAll("input:not([type=hidden]), textarea")]
    .some((field) => field.value !== field.defaultValue);
}

// Fetch the content again and swap it in; a live refresh (not `force`) gives way to typing,
// checked again once the content has arrived. Returns whether it swapped.
async function refresh(force) {
  const main = document.getElementById("content");
  const res = await fetch(partialUrl(), {cache: "no-store"});
  if (!res.ok && !(force && res.status === 404)) return false;
  const html = await res.text();
  if (!force && typing(main)) return false;
  main.innerHTML = html;
  disableActions();
  updateAges();
  document.dispatchEvent(new Event("conveyor:refreshed"));
  return true;
}

// A duration as people say it; the same words as html.py's `ago`.
function ago(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor(s % 3600 / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor(s % 86400 / 3600)} h`;
}

// <time data-since="unix seconds">: how long ago, kept current without a refresh (the JSON
// an open page polls leaves such ages out, so it changes only when the data does).
function updateAges() {
  const now = Date.now() / 1000;
  for (const t of document.querySelectorAll("time[data-since]")) {
    t.textContent = ago(now - Number(t.dataset.since));
  }
}

function disableActions() {
  const banner = document.getElementById("read-only");
  if (!banner) return;
  for (const button of document.querySelectorAll("form.action button")) {
    button.disabled = true;
    button.title = banner.textContent;
  }
}

async function poll() {
  timer = null;
  updateAges();
  const main = document.getElementById("content");
  const api = main && main.dataset.poll;
  if (!api || document.visibilityState !== "visible") return;
  try {
    const res = await fetch(api, {cache: "no-store"});
    const text = await res.text();
    // The first answer may already be newer than the page the server rendered: refresh
    // once then, so no change made between the render and the first poll is missed.
    // While someone types, nothing is swapped and the next poll tries again.
    if (text !== lastJson && !typing(main) && await refresh(false)) lastJson = text;
    document.getElementById("live").hidden = false;
  } catch (err) {
    document.getElementById("live").hidden = true;
  }
  schedule();
}

function schedule() {
  if (timer === null) timer = setTimeout(poll, POLL_MS);
}

async function act(form) {
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
  const body = {};
  for (const [k, v] of new FormData(form).entries()) body[k] = v;
  const res = await fetch(form.action, {
    method: "POST",
    headers: {"Content-Type": "application/json",
              "X-Conveyor-Token": sessionStorage.getItem(TOKEN_KEY) || ""},
    body: JSON.stringify(body),
  });
  let doc = {};
  try { doc = await res.json(); } catch (err) { doc = {error: res.statusText}; }
  flash(res.ok ? (doc.message || "done") : (doc.error || "refused"), res.ok);
  if (res.ok) {
    if (doc.location) { window.location.href = doc.location; return; }
    await refresh(true);
  }
}

function showToken() {
  const state = document.getElementById("token-state");
  if (state) state.textContent = sessionStorage.getItem(TOKEN_KEY) ? "token set" : "no token";
}

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.id === "token-form") {
    event.preventDefault();
    const input = document.getElementById("token");
    if (input.value) sessionStorage.setItem(TOKEN_KEY, input.value);
    else sessionStorage.removeItem(TOKEN_KEY);
    input.value = "";
    showToken();
  } else if (form.classList.contains("action")) {
    event.preventDefault();
    act(form).catch((err) => flash(String(err), false));
  }
});

document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") schedule();
});

document.addEventListener("DOMContentLoaded", () => {
  disableActions();
  showToken();
  schedule();
});
