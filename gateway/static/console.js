// The irrev operator console. Everything it shows comes from the gateway's admin API,
// called with the token the operator signs in with (kept in this tab's
// sessionStorage only); the page holds no authority of its own. It is served with a
// Content-Security-Policy that allows only this script and its stylesheet, so it
// builds every node with the DOM API, never from HTML strings.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  token: sessionStorage.getItem("irrev-admin") || "",
  tenant: sessionStorage.getItem("irrev-tenant") || "",
  unit: { currency: "", scale: 1 },
  skewMs: 0, // the gateway's clock minus this browser's, from each answer's Date header
  timer: null,
  running: null,
  cursor: null,
  decisions: [],
  unresolved: {}, // hold -> why the last reconciliation left it
  allAccounts: false,
  allAgents: false,
  queuePages: 1, // pages of the escalation queue shown ("Show more" adds one)
  bodies: new Map(), // hold -> its request body, fetched when first opened
  opened: new Set(), // holds whose body is open: it stays open across redraws
  updated: "", // the time of the last refresh that worked
  queue: { items: [], total: 0, more: false }, // the pages loaded, before the filters
  filters: { agent: "", route: "", reason: "" },
  selected: new Set(), // escalation ids ticked, always among those shown
  deciding: false, // a bulk decision is under way
  refusalReason: "", // the refusals shown: every reason, or this one
  refused: null, // the last refusal counts read
  policy: null, // the tenant's policy document, for the rule form's names
  pointerOnQueue: false, // the pointer is over the escalation queue's table
  leaving: null, // the timer that lets go of the queue once the pointer left it
};
const DECISIONS_KEPT = 60;
// Accounts listed before "show all": the ones an operator must watch come first.
const ACCOUNTS_SHOWN = 15;
const FEED_LOOKBACK_MS = 60 * 60 * 1000;
const FEED_PAGES_PER_REFRESH = 20;
// A request the gateway has not answered by then is abandoned (and the refresh retried
// on schedule), so one lost answer never stalls the page.
const REQUEST_TIMEOUT_MS = 20000;
// Decisions of a bulk action sent at once: each approval forwards its effect, so a
// few at a time, each consume-once on the gateway like a single one.
const BULK_PARALLEL = 4;
const REFUSAL_ROWS_SHOWN = 50;
const TOP_SHOWN = 5;
// The queue is let go (sorted again) this long after the pointer left its table, unless
// it came back: chromium reports a leave and an enter at the same point when it lays the
// view out again (a capture of the whole page, as the tests take), which must not move
// the rows under it.
const LEAVE_MS = 500;

class ApiError extends Error {
  // `reason`: the gateway's reason code when the refusal is its own, from its
  // X-Irrev-Reason header (gateway/edge/problems.py), never from the body: a tool API's
  // answer passes through an approval, and its JSON (written by the tool, maybe from
  // what the agent sent) may say `"reason": "escalation_resolved", "by": "cfo"`.
  constructor(status, body, reason) {
    super((body && (body.detail || body.title)) || `HTTP ${status}`);
    this.status = status;
    this.reason = reason || undefined;
    this.body = body || {};
  }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Authorization: "Bearer " + state.token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method, headers, cache: "no-store", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, { detail: e.name === "TimeoutError" ? "the gateway did not answer in time" : `the gateway is unreachable (${e.message})` });
  }
  const date = Date.parse(response.headers.get("Date") || "");
  if (!Number.isNaN(date)) state.skewMs = date - Date.now();
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { detail: text }; }
  if (!response.ok) throw new ApiError(response.status, data, response.headers.get("X-Irrev-Reason"));
  return { status: response.status, data };
}

const serverNow = () => Date.now() + state.skewMs;

// --- formatting -------------------------------------------------------------------

// Minor units (integers, possibly past 2^53 in principle) to "1,234.5 USD", digit for
// digit as the gateway's pricing.money.money_text writes them.
function money(minor, unit = state.unit) {
  if (minor === null || minor === undefined || minor === "") return "";
  let n;
  try { n = BigInt(minor); } catch { return String(minor); }
  const scale = BigInt(unit.scale || 1);
  const negative = n < 0n;
  if (negative) n = -n;
  const whole = (n / scale).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  let fraction = "";
  if (n % scale) {
    const digits = String(unit.scale || 1).length - 1;
    fraction = "." + (n % scale).toString().padStart(digits, "0").replace(/0+$/, "");
  }
  return `${negative ? "-" : ""}${whole}${fraction}${unit.currency ? " " + unit.currency : ""}`;
}

// The gateway's own formatted text where it gives one (`price_text` beside `price`).
const moneyOf = (item, field) => item[field + "_text"] ?? money(item[field]);

function duration(ms) {
  if (ms === null || Number.isNaN(ms)) return "—";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// A time from the API: an RFC 3339 string, or milliseconds since the epoch.
function timeMs(value) {
  if (value === null || value === undefined || value === "") return null;
  if (typeof value === "number") return value;
  const parsed = Date.parse(value);
  return Number.isNaN(parsed) ? null : parsed;
}

const clock = (ms) => new Date(ms).toLocaleTimeString(undefined, { hour12: false });
const percent = (ratio) => ratio === Infinity ? "over" : (100 * ratio).toFixed(1) + "%";

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "data") Object.assign(node.dataset, value);
    else node[key] = value;
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// What the operator's last action did: a success replaces an error and vice versa;
// the auto-refresh never clears it (it would, before anyone could read it).
function flash(message, isError = false) {
  steady(() => {
    $("flash").textContent = isError ? "" : message;
    $("flash").hidden = isError || !message;
    $("error").textContent = isError ? message : "";
    $("error").hidden = !isError || !message;
  });
}

// Whether the page is current: a failed refresh says so where the time of the last
// good one is shown, and the page keeps what it last drew.
function status(message, isError) {
  $("updated").textContent = message;
  $("updated").classList.toggle("stale", isError);
}

// --- sign in ----------------------------------------------------------------------

async function signIn(event) {
  event.preventDefault();
  state.token = $("token").value.trim();
  $("login-error").textContent = "";
  try {
    await loadTenants();
  } catch (e) {
    $("login-error").textContent = e.status === 401 || e.status === 403
      ? "This token is not an admin token of this gateway." : `Sign-in failed: ${e.message}`;
    return;
  }
  sessionStorage.setItem("irrev-admin", state.token);
  $("token").value = "";
  showApp(true);
  refresh();
}

function signOut() {
  sessionStorage.removeItem("irrev-admin");
  state.token = "";
  clearTimeout(state.timer);
  showApp(false);
}

function showApp(on) {
  $("login").hidden = on;
  $("app").hidden = !on;
  $("controls").hidden = !on;
}

async function loadTenants() {
  const { data } = await api("/v1/admin/tenants");
  const select = $("tenant");
  select.replaceChildren(...data.map((t) => new Option(t.tenant, t.tenant)));
  if (data.some((t) => t.tenant === state.tenant)) select.value = state.tenant;
  state.tenant = select.value;
}

function chooseTenant() {
  state.tenant = $("tenant").value;
  sessionStorage.setItem("irrev-tenant", state.tenant);
  state.cursor = null;
  state.decisions = [];
  state.unresolved = {};
  state.queuePages = 1;
  state.bodies.clear();
  state.opened.clear();
  state.selected.clear();
  state.filters = { agent: "", route: "", reason: "" };
  state.refusalReason = "";
  $("bulk-report").hidden = true;
  flash("");
  refresh(true);
}

// --- the refresh loop ---------------------------------------------------------------

function schedule() {
  clearTimeout(state.timer);
  const seconds = Number($("interval").value);
  if (seconds > 0 && state.token) state.timer = setTimeout(refresh, seconds * 1000);
}

// One refresh at a time. A refresh asked for while one runs waits for it; with
// `again` (the tenant changed, or an action was taken) another follows it at once.
async function refresh(again = false) {
  if (state.running) {
    if (!again) return state.running;
    await state.running;
    return refresh();
  }
  state.running = (async () => {
    try {
      await load();
      state.updated = clock(Date.now());
      status("updated " + state.updated, false);
    } catch (e) {
      if (e.status === 401) {
        signOut();
        $("login-error").textContent = "The gateway no longer accepts this token; sign in again.";
        return;
      }
      status(`not updated since ${state.updated || "sign-in"}: ${e.message}`, true);
    } finally {
      state.running = null;
      schedule();
    }
  })();
  return state.running;
}

async function load() {
  const tenant = state.tenant;
  const t = encodeURIComponent(tenant);
  const minutes = $("refusal-minutes").value;
  const [policy, balances, queue, ambiguous, rules, refused, keys, stress, agents] = await Promise.all([
    api(`/v1/admin/tenants/${t}/policy`),
    api(`/v1/admin/tenants/${t}/balances`),
    queuePages(t),
    api(`/v1/admin/tenants/${t}/holds?state=ambiguous`).then((r) => details(t, r.data)),
    api(`/v1/admin/tenants/${t}/rules`),
    api(`/v1/admin/tenants/${t}/refusals?minutes=${encodeURIComponent(minutes)}`),
    api(`/v1/admin/tenants/${t}/keys`),
    api(`/v1/admin/tenants/${t}/stress`),
    api(`/v1/admin/tenants/${t}/agents`),
  ]);
  if (tenant !== state.tenant) return; // chosen away meanwhile: the next refresh draws it
  state.unit = policy.data.risk_unit || state.unit;
  await loadDecisions(tenant);
  if (tenant !== state.tenant) return;
  steady(() => {
    renderSummary(balances.data, queue, ambiguous, refused.data);
    renderBalances(balances.data);
    renderEscalations(queue);
    renderRules(rules.data.rules, policy.data, balances.data);
    renderRefusals(refused.data);
    renderAgents(agents.data.agents, refused.data);
    renderKeys(keys.data.keys);
    renderStress(stress.data.detectors);
    renderAmbiguous(ambiguous);
    renderDecisions();
    for (const table of document.querySelectorAll("table.stack")) labelCells(table);
  });
}

// Under a narrow window the tables stack each row as a card (console.css): each cell
// then shows its column's name, from the table's header.
function labelCells(table) {
  const names = [...table.tHead.rows[0].cells].map((th) => th.dataset.label || th.textContent.trim());
  for (const tr of table.tBodies[0].rows) {
    [...tr.cells].forEach((td, i) => { if (names[i]) td.dataset.label = names[i]; });
  }
}

// The oldest state.queuePages pages of the queue (each page a bounded answer, without
// request bodies): {items, total waiting, more: whether pages are left}.
async function queuePages(t) {
  const items = [];
  let after = null;
  let total = 0;
  for (let page = 0; page < state.queuePages; page++) {
    const query = after ? `?after=${encodeURIComponent(after)}` : "";
    const { data } = await api(`/v1/admin/tenants/${t}/escalations${query}`);
    items.push(...data.escalations);
    total = data.total;
    after = data.next;
    if (!after) break;
  }
  return { items, total, more: Boolean(after) };
}

// The list of ambiguous holds says little; each hold by id tells who, what and why.
// Few are ever ambiguous at once, and past AMBIGUOUS_DETAILED only the list is shown.
const AMBIGUOUS_DETAILED = 50;
async function details(t, holds) {
  return Promise.all(holds.map((h, i) => i >= AMBIGUOUS_DETAILED ? h
    : api(`/v1/admin/tenants/${t}/holds/${encodeURIComponent(h.hold)}`).then((r) => r.data, () => h)));
}

// --- utilisation ------------------------------------------------------------------

const used = (b) => (b.pending || 0) + (b.posted || 0);
// A live raise_limit rule lifts an account's limit and soft limit by `raised` for a
// while: utilisation is measured against the limit in force.
const limitOf = (b) => b.effective_limit ?? b.limit;
const utilisation = (b) => limitOf(b) > 0 ? used(b) / limitOf(b) : (used(b) > 0 ? Infinity : 0);
const softRatio = (b) => limitOf(b) > 0 && b.soft_limit ? (b.soft_limit + (b.raised || 0)) / limitOf(b) : null;

function bar(b) {
  const ratio = utilisation(b);
  const soft = softRatio(b);
  const level = ratio >= 1 ? "over" : soft !== null && ratio >= soft ? "soft" : "ok";
  const fill = el("div", { className: "fill " + level });
  fill.style.width = Math.min(100, 100 * ratio) + "%";
  const track = el("div", { className: "track", title: `${percent(ratio)} of the limit` }, fill);
  if (soft !== null) {
    const mark = el("div", { className: "soft-mark", title: `soft band from ${percent(soft)}` });
    mark.style.left = 100 * soft + "%";
    track.append(mark);
  }
  return el("div", { className: "bar" }, track, el("span", { className: "pct " + level }, percent(ratio)));
}

function renderBalances(rows) {
  // Agents' accounts that hold nothing are only counted: a fleet has hundreds.
  const idle = rows.filter((b) => b.account.startsWith("agent:") && !used(b));
  const busy = rows.filter((b) => !idle.includes(b))
    .sort((a, b) => utilisation(b) - utilisation(a) || a.account.localeCompare(b.account));
  const shown = state.allAccounts ? busy : busy.slice(0, ACCOUNTS_SHOWN);
  $("balances").tBodies[0].replaceChildren(...shown.map((b) => {
    const [kind, ...name] = b.account.split(":");
    return el("tr", { data: { account: b.account } },
      el("td", { className: "account" }, el("span", { className: "kind " + kind }, kind), " ", name.join(":")),
      el("td", { className: "barcol" }, bar(b)),
      el("td", { className: "num used" }, money(used(b))),
      el("td", { className: "num pending" }, moneyOf(b, "pending")),
      el("td", { className: "num posted" }, moneyOf(b, "posted")),
      el("td", { className: "num available" + (b.available < 0 ? " negative" : "") }, moneyOf(b, "available")),
      el("td", { className: "num limit" }, money(limitOf(b)),
        b.raised ? el("div", { className: "muted" }, `raised by ${money(b.raised)} for now`) : null));
  }));
  const hidden = busy.length - shown.length;
  $("idle").textContent = [hidden ? `${hidden} accounts further from their limit are not shown.` : "",
    idle.length ? `${idle.length} agent accounts hold nothing.` : ""].join(" ");
  $("all-accounts").hidden = busy.length <= ACCOUNTS_SHOWN;
  $("all-accounts").textContent = state.allAccounts ? "Show the closest only" : `Show all ${busy.length}`;
}

// --- summary tiles ----------------------------------------------------------------

function renderSummary(balances, queue, ambiguous, refused) {
  const tenantRow = balances.find((b) => b.account.startsWith("tenant:"));
  const lefts = queue.items.map(timeLeft);
  const tiles = [
    ["tenant budget", tenantRow ? percent(utilisation(tenantRow)) : "—",
      tenantRow ? `${money(used(tenantRow))} of ${money(limitOf(tenantRow))}` : ""],
    ["waiting for a human", String(queue.total),
      lefts.length ? `next expires in ${duration(Math.min(...lefts))}` : "queue empty"],
    ["ambiguous holds", String(ambiguous.length), ambiguous.length ? "charged until resolved" : ""],
    ["refused", String(refused.total), `in the last ${refused.minutes} minutes`],
  ];
  $("summary").replaceChildren(...tiles.map(([label, value, note]) =>
    el("div", { className: "tile" }, el("div", { className: "label" }, label),
      el("div", { className: "value" }, value), el("div", { className: "muted" }, note))));
}

// --- escalations ------------------------------------------------------------------

const timeLeft = (e) => timeMs(e.deadline_at) - serverNow();
const age = (e) => serverNow() - timeMs(e.created_at);

// Which account's soft band or approval threshold sent it here, and how full that
// account would be once approved; or the route's own threshold.
function tripped(e) {
  const t = e.tripped || {};
  const cause = el("div", { className: "muted" }, (e.reason || "").replace(/_/g, " "));
  if (!t.account) {
    return el("span", {}, el("div", {}, "route threshold"),
      el("div", { className: "muted" }, `above ${t.threshold_text || ""}`), cause);
  }
  const ratio = t.utilisation === null || t.utilisation === undefined ? null : Number(t.utilisation);
  return el("span", {}, el("div", { className: "mono" }, t.account),
    ratio === null ? null : el("div", { className: ratio >= 1 ? "urgent" : "" }, `${percent(ratio)} once approved`),
    el("div", { className: "muted" }, `${t.used_text} of ${t.limit_text} used`), cause);
}

// The body is not in the queue's pages (each may be up to a MiB): it is read from the
// hold when first opened, and kept (and kept open) for the redraws that follow.
function requestCell(e) {
  const pre = el("pre", {}, state.bodies.get(e.hold) ?? "");
  const cell = el("details", {}, el("summary", {}, "body"), pre);
  cell.open = state.opened.has(e.hold);
  cell.addEventListener("toggle", async () => {
    if (cell.open) state.opened.add(e.hold);
    else state.opened.delete(e.hold);
    if (!cell.open || state.bodies.has(e.hold)) return;
    try {
      const t = encodeURIComponent(state.tenant);
      const { data } = await api(`/v1/admin/tenants/${t}/holds/${encodeURIComponent(e.hold)}`);
      state.bodies.set(e.hold, data.body ?? "");
      pre.textContent = data.body || "—";
    } catch (err) {
      pre.textContent = `not read: ${err.message}`;
    }
  });
  return cell;
}

function decisionCell(e) {
  const reason = el("input", {
    type: "text", className: "reason", placeholder: "reason (to the agent and the journal)",
    maxLength: 500,
  });
  const approve = el("button", { type: "button", className: "approve" }, "Approve");
  const reject = el("button", { type: "button", className: "reject" }, "Reject");
  approve.addEventListener("click", () => decide(e.escalation, "approve", reason, [approve, reject]));
  reject.addEventListener("click", () => decide(e.escalation, "reject", reason, [approve, reject]));
  return el("div", { className: "decide" }, reason, approve, reject);
}

// How long it has waited and has left: the one cell a row held still still updates.
function waited(e) {
  const left = timeLeft(e);
  return [el("div", {}, duration(age(e)) + " ago"),
    el("div", { className: left < 60000 ? "urgent" : "muted" }, left > 0 ? `${duration(left)} left` : "expiring")];
}

function escalationCells(e) {
  return [
    el("td", { className: "when" }, ...waited(e)),
    el("td", { className: "who" }, el("div", {}, e.agent || ""),
      el("div", { className: "muted" }, e.principal || "")),
    el("td", { className: "route mono" }, el("div", { className: "muted" }, e.route || ""),
      el("div", { className: "target" }, e.target || ""),
      ...(e.headers || []).map((h) => el("div", { className: "header" }, h))),
    el("td", { className: "num face" }, moneyOf(e, "face_value")),
    el("td", { className: "num price" }, moneyOf(e, "price")),
    el("td", { className: "tripped" }, tripped(e)),
    el("td", { className: "request" }, requestCell(e)),
  ];
}

// A kept row's cells between its pick and decision cells are replaced; those two (and
// an input in them that has the focus) are never detached, which would blur it.
function redraw(tr, cells) {
  const decision = tr.querySelector(":scope > td.decision");
  for (const td of [...tr.cells]) {
    if (!td.classList.contains("decision") && !td.classList.contains("pick")) td.remove();
  }
  decision.before(...cells);
}

// Puts `rows` in this order, moving only rows that are out of place.
function place(tbody, rows) {
  rows.forEach((tr, i) => {
    if (tbody.rows[i] !== tr) tbody.insertBefore(tr, tbody.rows[i] || null);
  });
  while (tbody.rows.length > rows.length) tbody.rows[rows.length].remove();
}

// A select's (or datalist's) options as [value, label] pairs, replaced only when they
// changed: the auto-refresh must not close a list the operator has open.
function setOptions(list, options, current) {
  const now = [...list.children].map((o) => [o.value, o.textContent]);
  if (JSON.stringify(now) !== JSON.stringify(options)) {
    list.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
  }
  if (current !== undefined) list.value = current;
}

// The filters' choices: what the loaded escalations have, each with how many.
function fillFilter(select, values, current) {
  const counts = new Map();
  for (const v of values) counts.set(v, (counts.get(v) || 0) + 1);
  const options = [...counts].sort((a, b) => a[0].localeCompare(b[0])).map(([v, n]) => [v, `${v} (${n})`]);
  if (current && !counts.has(current)) options.unshift([current, `${current} (0)`]);
  setOptions(select, [["", "any"], ...options], current);
}

const matches = (e) => Object.entries(state.filters).every(([field, value]) => !value || e[field] === value);

function pickCell(e) {
  const box = el("input", { type: "checkbox", className: "pick", title: "select for a bulk decision" });
  box.setAttribute("aria-label", `select ${e.escalation}`);
  box.addEventListener("change", () => {
    if (box.checked) state.selected.add(e.escalation);
    else state.selected.delete(e.escalation);
    showSelection();
  });
  return box;
}

function escalationRow(e, existing) {
  const kept = existing.get(e.escalation);
  const tr = kept && !kept.classList.contains("gone") ? kept
    : el("tr", { data: { escalation: e.escalation, hold: e.hold } },
      el("td", { className: "pick" }, pickCell(e)), el("td", { className: "decision" }, decisionCell(e)));
  redraw(tr, escalationCells(e));
  return tr;
}

// Rows are kept by escalation id across refreshes, so that a reason being typed (and
// the focus) survives the auto-refresh; only the context cells are redrawn. The
// filters hide what does not match; a selection is always among the rows shown.
// While the approver is at the queue the rows hold still (holdStill); otherwise, and
// once the pointer leaves it (`sorted`: a filter chosen), they are sorted by time left.
function renderEscalations(queue, sorted = false) {
  state.queue = queue;
  fillFilter($("filter-agent"), queue.items.map((e) => e.agent || ""), state.filters.agent);
  fillFilter($("filter-route"), queue.items.map((e) => e.route || ""), state.filters.route);
  fillFilter($("filter-reason"), queue.items.map((e) => e.reason || ""), state.filters.reason);
  const items = queue.items.filter(matches);
  const tbody = $("escalations").tBodies[0];
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.escalation, tr]));
  if (!sorted && aiming() && tbody.dataset.tenant === state.tenant) holdStill(tbody, items, existing);
  else {
    letGo();
    items.sort((a, b) => timeLeft(a) - timeLeft(b));
    place(tbody, items.map((e) => escalationRow(e, existing)));
  }
  tbody.dataset.tenant = state.tenant;
  const shown = new Set(items.map((e) => e.escalation));
  for (const id of state.selected) if (!shown.has(id)) state.selected.delete(id);
  showSelection();
  $("escalation-count").textContent = queue.total ? String(queue.total) : "";
  const empty = document.querySelector('.empty[data-for="escalations"]');
  empty.hidden = items.length > 0;
  empty.textContent = queue.items.length ? `No escalation shown matches the filters (${queue.total} wait).`
    : "Nothing waits for a decision.";
  $("filter-count").textContent = items.length === queue.items.length ? ""
    : `${items.length} of the ${queue.items.length} loaded match`;
  $("queue-more").hidden = !queue.more;
  $("queue-more").textContent = `Show more (${queue.items.length} of ${queue.total} shown)`;
  const waiting = new Set(queue.items.map((e) => e.hold));
  for (const hold of state.bodies.keys()) if (!waiting.has(hold)) state.bodies.delete(hold);
  for (const hold of state.opened) if (!waiting.has(hold)) state.opened.delete(hold);
}

// --- the queue holds still under the approver's hand --------------------------------

// Whether the approver is at the queue: the pointer over its table, or the focus on a
// control of a row that still waits. An agent must not be able to move its escalation
// under a pointer aimed at another (by withdrawing one of its own above it, or by
// raising one that sorts above it) for the click to approve it.
function aiming() {
  const table = $("escalations");
  const focus = document.activeElement;
  const focused = focus !== table && table.contains(focus) && !focus.disabled && !focus.closest("tr.gone");
  return state.pointerOnQueue || focused;
}

// The rows as they stand: none moves, none is removed, none is put between them. One
// whose escalation left (decided, expired, withdrawn) stays in its place, greyed, its
// controls disabled and covered by why it left; a new escalation is added at the end;
// the columns keep their widths (a new row's text cannot re-wrap the rows above it),
// and a kept row updates only its time left, on one line (console.css table.held).
function holdStill(tbody, items, existing) {
  const table = $("escalations");
  if (!table.classList.contains("held") && table.tHead.offsetParent !== null) {
    for (const th of table.tHead.rows[0].cells) th.style.width = th.getBoundingClientRect().width + "px";
  }
  table.classList.add("held");
  const waiting = new Map(state.queue.items.map((e) => [e.escalation, e]));
  for (const tr of tbody.rows) {
    const e = waiting.get(tr.dataset.escalation);
    if (e) tr.querySelector("td.when").replaceChildren(...waited(e));
    else if (!tr.classList.contains("gone")) leftQueue(tr);
  }
  for (const e of items) if (!existing.has(e.escalation)) tbody.append(escalationRow(e, existing));
}

function leftQueue(tr) {
  tr.classList.add("gone");
  for (const control of tr.querySelectorAll("input, button")) control.disabled = true;
  const note = el("div", { className: "gone-note" }, "no longer waiting");
  tr.querySelector("td.decision").append(note);
  const t = encodeURIComponent(state.tenant);
  api(`/v1/admin/tenants/${t}/holds/${encodeURIComponent(tr.dataset.hold)}`)
    .then(({ data }) => { note.textContent = `no longer waiting: ${howItLeft(data)}`; }, () => {});
}

// What became of a hold that left the queue, from the hold itself: the events feed
// has no event for a hold its agent voided.
function howItLeft(h) {
  if (h.state === "expired") return "expired";
  if (h.state === "rejected") return `rejected by ${h.by}`;
  if (h.by) return `approved by ${h.by}`;
  return h.state === "voided" ? "withdrawn by the agent" : h.state;
}

// The queue sorted again, its rows that left gone: once the approver is no longer at
// it (the pointer left its table, the focus left its controls).
function settle() {
  if (!aiming() && $("escalations").classList.contains("held")) {
    steady(() => {
      renderEscalations(state.queue);
      labelCells($("escalations"));
    });
  }
}

function letGo() {
  const table = $("escalations");
  table.classList.remove("held");
  table.style.marginTop = "";
  for (const th of table.tHead.rows[0].cells) th.style.width = "";
}

// What changes above the queue (a message, the tiles, the filters' widths) must not
// move it while the approver is at it: the window scrolls by what the table moved, or
// a margin above it takes up what shrank at the top of the page.
function steady(change) {
  const table = $("escalations");
  if (!aiming() || table.offsetParent === null) return change();
  const before = table.getBoundingClientRect().top;
  change();
  let moved = table.getBoundingClientRect().top - before;
  if (moved > 0) {
    window.scrollBy(0, moved);
    moved = table.getBoundingClientRect().top - before;
  }
  if (moved !== 0 && table.classList.contains("held")) {
    table.style.marginTop = Math.max(0, (parseFloat(table.style.marginTop) || 0) - moved) + "px";
  }
}

// The ticks, the "all shown" box and the bulk buttons, as the selection is.
function showSelection() {
  const rows = [...$("escalations").tBodies[0].rows].filter((tr) => !tr.classList.contains("gone"));
  for (const tr of $("escalations").tBodies[0].rows) {
    tr.querySelector("input.pick").checked = state.selected.has(tr.dataset.escalation);
  }
  const n = state.selected.size;
  const all = $("select-shown");
  all.checked = n > 0 && n === rows.length;
  all.indeterminate = n > 0 && n < rows.length;
  $("bulk-count").textContent = `${n} selected`;
  $("bulk-approve").disabled = $("bulk-reject").disabled = n === 0 || state.deciding;
}

function selectShown() {
  const rows = [...$("escalations").tBodies[0].rows].filter((tr) => !tr.classList.contains("gone"));
  const every = $("select-shown").checked;
  state.selected.clear();
  if (every) for (const tr of rows) state.selected.add(tr.dataset.escalation);
  showSelection();
}

function chooseFilter(field, select) {
  state.filters[field] = select.value;
  renderEscalations(state.queue, true);
  labelCells($("escalations"));
}

// One decision, by the gateway's per-escalation endpoint (a consume-once claim):
// {escalation, kind: "done" | "resolved" (another decision won) | "failed", text}.
async function decideOne(escalation, verb, reason) {
  try {
    const { status, data } = await api(`/v1/escalations/${encodeURIComponent(escalation)}/${verb}`, {
      method: "POST", body: reason ? { reason } : {},
    });
    const text = verb === "reject" ? "rejected"
      : data && data.status === "approved" ? "approved (the in-process tool acts on it)"
      : `approved; the tool API answered ${status}`;
    return { escalation, kind: "done", text };
  } catch (e) {
    if (e.reason === "escalation_resolved") {
      const by = e.body.by ? ` by ${e.body.by}` : "";
      return { escalation, kind: "resolved", text: `already ${e.body.state || "decided"}${by}` };
    }
    // An answer the gateway did not mark as its own (no X-Irrev-Reason) is the tool
    // API's: the approval went through and the tool refused or failed, which the agent
    // is told too. Whatever its body says of who decided, it is not shown as a decision.
    if (verb === "approve" && e.status && !e.reason) {
      return { escalation, kind: "done", text: `approved; the tool API answered ${e.status}` };
    }
    return { escalation, kind: "failed", text: e.message };
  }
}

async function decide(escalation, verb, reasonInput, buttons) {
  const reason = reasonInput.value.trim();
  buttons.forEach((b) => { b.disabled = true; });
  const outcome = await decideOne(escalation, verb, reason);
  if (outcome.kind === "done") flash(`${escalation}: ${outcome.text}${reason ? ` — “${reason}”` : ""}`);
  else {
    flash(`${verb} ${escalation}: ${outcome.text}`, true);
    if (!buttons[0].closest("tr.gone")) buttons.forEach((b) => { b.disabled = false; });
  }
  await refresh(true);
}

// `work` of each item, at most `parallel` at a time; the results in the items' order.
async function inPool(items, parallel, work) {
  const results = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      results[i] = await work(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(parallel, items.length) }, worker));
  return results;
}

// Every selected escalation decided the same way with one reason, each by its own
// consume-once call: one that another person (or a rule) decided meanwhile is reported
// as such, never decided twice.
async function decideSelected(verb) {
  const chosen = [...state.selected];
  if (!chosen.length || state.deciding) return;
  const reason = $("bulk-reason").value.trim();
  state.deciding = true;
  showSelection();
  const outcomes = await inPool(chosen, BULK_PARALLEL, (id) => decideOne(id, verb, reason));
  state.deciding = false;
  state.selected.clear();
  const count = (kind) => outcomes.filter((o) => o.kind === kind).length;
  const done = count("done");
  const parts = [`${done} ${verb === "approve" ? "approved" : "rejected"}`];
  if (count("resolved")) parts.push(`${count("resolved")} already decided`);
  if (count("failed")) parts.push(`${count("failed")} failed`);
  flash(`${verb === "approve" ? "Approve" : "Reject"} ${chosen.length} selected: ${parts.join(", ")}`
    + (reason ? ` — “${reason}”` : ""), count("failed") > 0);
  $("bulk-report").replaceChildren(...outcomes.map((o) => el("li", { className: o.kind },
    el("span", { className: "mono" }, o.escalation), " ", o.text)));
  $("bulk-report").hidden = false;
  if (done) $("bulk-reason").value = "";
  await refresh(true);
}

// --- rules ------------------------------------------------------------------------

function ruleTarget(r) {
  if (r.kind === "raise_limit") return r.account;
  return r.agent ? `agent ${r.agent}` : `principal ${r.principal}`;
}

// Rows are kept by rule id, their "End now" button with them: a click is never lost to
// the auto-refresh redrawing the row under it.
function renderRules(rules, policy, balances) {
  const tbody = $("rules").tBodies[0];
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.rule, tr]));
  place(tbody, rules.map((r) => {
    let tr = existing.get(r.rule);
    if (!tr) {
      const end = el("button", { type: "button", className: "end" }, "End now");
      end.addEventListener("click", () => endRule(r.rule, end));
      tr = el("tr", { data: { rule: r.rule } }, el("td", { className: "decision" }, end));
    }
    const left = timeMs(r.until) - serverNow();
    redraw(tr, [
      el("td", { className: "mono" }, r.rule),
      el("td", {}, r.kind === "raise_limit" ? "raise limit" : "auto-approve"),
      el("td", { className: "target" }, ruleTarget(r)),
      el("td", { className: "num" }, r.kind === "raise_limit" ? "+" + moneyOf(r, "amount") : "up to " + moneyOf(r, "max_price")),
      el("td", {}, el("div", {}, clock(timeMs(r.until))), el("div", { className: "muted" }, `${duration(left)} left`)),
      el("td", {}, el("div", {}, r.by || ""), el("div", { className: "muted" }, r.reason || "")),
    ]);
    return tr;
  }));
  document.querySelector('.empty[data-for="rules"]').hidden = rules.length > 0;
  state.policy = policy;
  fillRuleNames();
  setOptions($("rule-accounts"), balances.map((b) => [b.account, b.account]));
}

// The names the form suggests: the policy's agents or principals.
function fillRuleNames() {
  const policy = state.policy || {};
  const names = $("rule-who-kind").value === "agent" ? Object.keys(policy.agents || {})
    : Object.keys((policy.accounts || {}).principals || {});
  setOptions($("rule-names"), names.sort().map((n) => [n, n]));
}

function chooseRuleKind() {
  const kind = $("rule-kind").value;
  for (const label of document.querySelectorAll("#rule-form [data-kind]")) {
    label.hidden = label.dataset.kind !== kind;
  }
}

function ruleError(message) {
  $("rule-error").textContent = message;
  $("rule-error").hidden = !message;
}

// The rule as the form says it; the gateway checks it (and the admin's role) and its
// refusal is shown as it said it.
async function setRule(event) {
  event.preventDefault();
  const kind = $("rule-kind").value;
  const value = (id) => $(id).value.trim();
  const body = { kind, duration: value("rule-duration"), reason: value("rule-reason") };
  if (kind === "auto_approve") {
    body[$("rule-who-kind").value] = value("rule-who");
    body.max_price = value("rule-max-price");
  } else {
    body.account = value("rule-account");
    body.amount = value("rule-amount");
  }
  $("rule-set").disabled = true;
  try {
    const { data } = await api(`/v1/admin/tenants/${encodeURIComponent(state.tenant)}/rules`, { method: "POST", body });
    ruleError("");
    flash(`rule ${data.rule} set: ${kind === "raise_limit" ? "raise" : "auto-approve"} ${ruleTarget(data)} until ${clock(timeMs(data.until))}`);
    $("rule-reason").value = "";
  } catch (e) {
    ruleError(`Not set: ${e.message}`);
    flash(`rule not set: ${e.message}`, true);
  } finally {
    $("rule-set").disabled = false;
  }
  await refresh(true);
}

async function endRule(rule, button) {
  button.disabled = true;
  try {
    await api(`/v1/admin/tenants/${encodeURIComponent(state.tenant)}/rules/${encodeURIComponent(rule)}`, { method: "DELETE" });
    flash(`rule ${rule} ended`);
  } catch (e) {
    flash(`end rule ${rule}: ${e.message}`, true);
    button.disabled = false;
  }
  await refresh(true);
}

// --- keys ---------------------------------------------------------------------------

const keyWhose = (k) => k.kind === "agent" ? `agent ${k.agent}` : `admin ${k.admin} (${k.role})`;
const keyTime = (value, none) => value ? `${new Date(timeMs(value)).toLocaleDateString()} ${clock(timeMs(value))}` : none;

// Rows are kept by key id, their Revoke button with them (as the rules' End now). The
// gateway checks the admin's role: a refusal is shown in its words.
function renderKeys(keys) {
  const tbody = $("keys").tBodies[0];
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.key, tr]));
  place(tbody, keys.map((k) => {
    let tr = existing.get(k.key_id);
    if (!tr) {
      const revoke = el("button", { type: "button", className: "end" }, "Revoke");
      revoke.addEventListener("click", () => revokeKey(k.key_id, revoke));
      tr = el("tr", { data: { key: k.key_id } }, el("td", { className: "decision" }, revoke));
    }
    tr.querySelector("td.decision button").hidden = k.state !== "live";
    redraw(tr, [
      el("td", { className: "mono" }, k.key_id, el("div", { className: "muted" }, k.token_sha256_prefix)),
      el("td", {}, k.kind),
      el("td", { className: "target" }, keyWhose(k)),
      el("td", {}, el("div", {}, k.owner), el("div", { className: "muted" }, k.purpose)),
      el("td", {}, keyTime(k.expires_at, "never")),
      el("td", {}, keyTime(k.last_used_at, "not yet")),
      el("td", { className: "key-state " + k.state }, k.state),
    ]);
    return tr;
  }));
  document.querySelector('.empty[data-for="keys"]').hidden = keys.length > 0;
}

async function revokeKey(keyId, button) {
  button.disabled = true;
  try {
    await api(`/v1/admin/tenants/${encodeURIComponent(state.tenant)}/keys/${encodeURIComponent(keyId)}/revoke`, { method: "POST" });
    flash(`key ${keyId} revoked`);
  } catch (e) {
    flash(`revoke key ${keyId}: ${e.message}`, true);
  } finally {
    button.disabled = false;
  }
  await refresh(true);
}

// --- stress detectors ---------------------------------------------------------------

function renderStress(detectors) {
  const on = detectors.filter((d) => d.on).length;
  $("stress-count").textContent = on ? `${on} on` : "";
  $("stress").tBodies[0].replaceChildren(...detectors.map((d) => el("tr", { data: { route: d.route } },
    el("td", { className: "route mono" }, d.route),
    el("td", { className: "stress-state" },
      el("span", { className: "event " + (d.on ? "escalated" : "admitted") }, d.on ? "on" : "off"),
      d.on ? el("div", { className: "muted" }, `priced at ${d.loss_factor} of face value until ${clock(timeMs(d.on_until))}`) : null),
    el("td", { className: "num" }, `${d.score} of ${d.threshold}`),
    el("td", { className: "num" }, String(d.calm_per_second)),
    el("td", { className: "last" }, d.last_trip_at ? clock(timeMs(d.last_trip_at)) : "never"))));
  document.querySelector('.empty[data-for="stress"]').hidden = detectors.length > 0;
}

// --- refusals -----------------------------------------------------------------------

const shortTime = (value) => {
  const ms = timeMs(value);
  return ms === null ? "" : new Date(ms).toLocaleTimeString(undefined, { hour12: false, hour: "2-digit", minute: "2-digit" });
};

function topList(list, rows, name) {
  list.replaceChildren(...rows.slice(0, TOP_SHOWN).map((r) => el("li", {},
    el("span", { className: "mono" }, r[name] === "*" ? "(others)" : r[name]), " ",
    el("span", { className: "muted" }, String(r.count)))));
}

function renderRefusals(data) {
  state.refused = data;
  const chart = $("refusal-chart");
  const most = Math.max(1, ...data.per_minute.map((m) => m.count));
  chart.replaceChildren(...data.per_minute.map((m) => {
    const reasons = Object.entries(m.by_reason).map(([r, n]) => `${r} ${n}`).join(", ");
    const bar = el("div", { className: "minute" + (m.count ? "" : " none"), title: `${shortTime(m.at)}: ${m.count}${reasons ? " — " + reasons : ""}` });
    bar.style.height = `${Math.max(m.count ? 8 : 2, (100 * m.count) / most)}%`;
    bar.dataset.count = String(m.count);
    return bar;
  }));
  const first = data.per_minute.length ? shortTime(data.per_minute[0].at) : "";
  $("refusal-axis").replaceChildren(el("span", {}, first), el("span", {}, "now"));
  $("refusal-count").textContent = data.total ? String(data.total) : "";
  const reasons = data.by_reason.map((r) => r.reason);
  if (state.refusalReason && !reasons.includes(state.refusalReason)) reasons.push(state.refusalReason);
  setOptions($("refusal-reason"), [["", "any"], ...reasons.map((r) => [r, r])], state.refusalReason);
  topList($("refusal-reasons"), data.by_reason, "reason");
  topList($("refusal-agents"), data.by_agent, "agent");
  topList($("refusal-routes"), data.by_route, "route");
  const rows = data.rows.filter((r) => !state.refusalReason || r.reason === state.refusalReason);
  $("refusals").tBodies[0].replaceChildren(...rows.slice(0, REFUSAL_ROWS_SHOWN).map((r) => el("tr",
    { data: { reason: r.reason, agent: r.agent, via: r.transport } },
    el("td", { className: "reason" }, el("span", { className: "event denied" }, r.reason)),
    el("td", { className: "agent" }, r.agent === "*" ? "(others)" : r.agent),
    el("td", { className: "route mono" }, r.route === "*" ? "(others)" : r.route),
    el("td", { className: "via" }, r.transport),
    el("td", { className: "num n" }, String(r.count)),
    el("td", { className: "last" }, shortTime(r.last_at)))));
  document.querySelector('.empty[data-for="refusals"]').hidden = rows.length > 0;
  const hidden = Math.max(0, rows.length - REFUSAL_ROWS_SHOWN) + (data.rows_total - data.rows.length);
  $("refusal-note").textContent = `${data.total} in ${data.minutes} minutes; counted by every gateway, `
    + `up to ${data.flush_s} s late${hidden ? `; ${hidden} rarer rows not shown` : ""}`;
}

// --- agents -------------------------------------------------------------------------

function agentCell(a) {
  const reason = el("input", {
    type: "text", className: "reason", maxLength: 500,
    placeholder: "reason (required to suspend: told to the agent, kept in the history)",
  });
  const suspend = el("button", { type: "button", className: "reject suspend" }, "Suspend");
  const resume = el("button", { type: "button", className: "approve resume" }, "Resume");
  suspend.addEventListener("click", () => setSuspended(a.agent, "suspend", reason, [suspend, resume]));
  resume.addEventListener("click", () => setSuspended(a.agent, "resume", reason, [suspend, resume]));
  return el("div", { className: "decide" }, reason, suspend, resume);
}

// Rows are kept by agent, their reason input with them (the auto-refresh must not
// wipe a reason being typed). The suspended and the refused first, where a hostile
// agent is; the quiet ones (a policy may have hundreds) only when asked for.
function renderAgents(agents, refused) {
  const counts = new Map(refused.by_agent.map((r) => [r.agent, r.count]));
  const refusedOf = (a) => counts.get(a.agent) || 0;
  const rank = (a) => (a.suspended ? 1 : 0) * Number.MAX_SAFE_INTEGER + refusedOf(a);
  const sorted = [...agents].sort((x, y) => rank(y) - rank(x) || x.agent.localeCompare(y.agent));
  const quiet = sorted.filter((a) => rank(a) === 0).length;
  const shown = state.allAgents ? sorted : sorted.filter((a) => rank(a) > 0);
  const tbody = $("agents").tBodies[0];
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.agent, tr]));
  place(tbody, shown.map((a) => {
    let tr = existing.get(a.agent);
    if (!tr) tr = el("tr", { data: { agent: a.agent } }, el("td", { className: "decision" }, agentCell(a)));
    const s = a.suspended;
    tr.dataset.state = a.state;
    tr.querySelector("button.suspend").hidden = Boolean(s);
    tr.querySelector("button.resume").hidden = !s;
    redraw(tr, [
      el("td", { className: "agent" }, a.agent),
      el("td", { className: "muted" }, a.principal),
      el("td", { className: "num refused" }, String(refusedOf(a))),
      el("td", { className: "agent-state" },
        el("span", { className: "event " + (s ? "denied" : "admitted") }, a.state),
        s ? el("div", { className: "suspension" }, `“${s.reason}”`,
          el("div", { className: "muted" }, `by ${s.by}, ${keyTime(s.at, "")}`)) : null),
    ]);
    return tr;
  }));
  const suspended = agents.filter((a) => a.suspended).length;
  $("suspended-count").textContent = suspended ? `${suspended} suspended` : "";
  document.querySelector('.empty[data-for="agents"]').hidden = shown.length > 0;
  $("agents-quiet").textContent = quiet && !state.allAgents
    ? `${quiet} other agents were not refused in this window.` : "";
  $("all-agents").hidden = quiet === 0;
  $("all-agents").textContent = state.allAgents ? "Show the refused and suspended only" : `Show all ${agents.length}`;
}

// The gateway checks the role and the reason: a refusal is shown in its words.
async function setSuspended(agent, verb, reasonInput, buttons) {
  const reason = reasonInput.value.trim();
  if (verb === "suspend" && !reason) {
    flash("Say why before suspending an agent: the reason is told to the agent with every refusal.", true);
    reasonInput.focus();
    return;
  }
  buttons.forEach((b) => { b.disabled = true; });
  const path = `/v1/admin/tenants/${encodeURIComponent(state.tenant)}/agents/${encodeURIComponent(agent)}/${verb}`;
  try {
    const { data } = await api(path, { method: "POST", body: reason ? { reason } : {} });
    flash(data.changed ? `agent ${agent} ${data.state}: policy version ${data.version}`
      : `agent ${agent} was already ${data.state}`);
    reasonInput.value = "";
  } catch (e) {
    flash(`${verb} agent ${agent}: ${e.message}`, true);
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
  await refresh(true);
}

// --- ambiguous holds ----------------------------------------------------------------

function charged(h) {
  if (h.price !== undefined) return moneyOf(h, "price");
  const amounts = h.amounts || {};
  const tenantAccount = Object.keys(amounts).find((a) => a.startsWith("tenant:"));
  return tenantAccount ? money(amounts[tenantAccount]) : "";
}

function resolveCell(h) {
  const reason = el("input", {
    type: "text", className: "reason", placeholder: "reason (required)", maxLength: 500,
  });
  const posted = el("button", { type: "button", className: "posted" }, "It happened: post");
  const voided = el("button", { type: "button", className: "voided" }, "It did not: void");
  posted.addEventListener("click", () => resolve(h.hold, "posted", reason, [posted, voided]));
  voided.addEventListener("click", () => resolve(h.hold, "voided", reason, [posted, voided]));
  return el("div", { className: "decide" }, reason, posted, voided);
}

function renderAmbiguous(holds) {
  const tbody = $("ambiguous").tBodies[0];
  const empty = document.querySelector('.empty[data-for="ambiguous"]');
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.hold, tr]));
  const rows = holds.map((h) => {
    let tr = existing.get(h.hold);
    if (!tr) tr = el("tr", { data: { hold: h.hold } }, el("td", { className: "decision" }, resolveCell(h)));
    const since = timeMs(h.created_at);
    const left = state.unresolved[h.hold];
    redraw(tr, [
      el("td", { className: "mono" }, h.hold),
      el("td", {}, since === null ? "" : duration(serverNow() - since) + " ago"),
      el("td", {}, el("div", {}, h.agent || ""), el("div", { className: "muted mono" }, h.route || "")),
      el("td", { className: "num" }, charged(h)),
      el("td", { className: "why" }, h.ambiguity || "", ...(h.flags || []).map((f) => el("span", { className: "flag" }, f)),
        left ? el("div", { className: "muted" }, `reconcile: ${left}`) : null),
    ]);
    return tr;
  });
  place(tbody, rows);
  $("ambiguous-count").textContent = holds.length ? String(holds.length) : "";
  empty.hidden = holds.length > 0;
}

async function resolve(hold, outcome, reasonInput, buttons) {
  const reason = reasonInput.value.trim();
  if (!reason) {
    flash("Say why before resolving a hold by hand: the reason is journaled.", true);
    reasonInput.focus();
    return;
  }
  buttons.forEach((b) => { b.disabled = true; });
  const t = encodeURIComponent(state.tenant);
  try {
    await api(`/v1/admin/tenants/${t}/holds/${encodeURIComponent(hold)}/resolve`, {
      method: "POST", body: { outcome, reason },
    });
    flash(`${hold}: resolved as ${outcome} — “${reason}”`);
  } catch (e) {
    flash(`resolve ${hold}: ${e.message}`, true);
    buttons.forEach((b) => { b.disabled = false; });
  }
  await refresh(true);
}

async function reconcileNow() {
  const button = $("reconcile");
  button.disabled = true;
  try {
    const { data } = await api(`/v1/admin/tenants/${encodeURIComponent(state.tenant)}/reconcile`, { method: "POST" });
    state.unresolved = data.unresolved || {};
    $("reconcile-report").textContent = `last run ${clock(Date.now())}: ${(data.posted || []).length} posted, `
      + `${(data.voided || []).length} voided, ${Object.keys(state.unresolved).length} left for a human`;
  } catch (e) {
    flash(`reconcile: ${e.message}`, true);
  } finally {
    button.disabled = false;
  }
  await refresh(true);
}

// --- recent decisions ---------------------------------------------------------------

// The events feed (escalated, approved, rejected, expired, ambiguous and resolved
// holds, rules) is read forward from a cursor, a journal entry id: the first read
// starts an hour back (entry ids are milliseconds first), each later one reads only
// what is new. `next` moves past journal entries that are no events too.
async function loadDecisions(tenant) {
  const t = encodeURIComponent(tenant);
  if (state.cursor === null) state.cursor = `${Math.max(0, Math.floor(serverNow() - FEED_LOOKBACK_MS))}-0`;
  for (let page = 0; page < FEED_PAGES_PER_REFRESH; page++) {
    const { data } = await api(`/v1/admin/tenants/${t}/events?after=${encodeURIComponent(state.cursor)}&limit=500`);
    if (tenant !== state.tenant) return;
    state.decisions.push(...data.events.map(fromEvent));
    if (data.next === state.cursor) break;
    state.cursor = data.next;
  }
  state.decisions = state.decisions.slice(-DECISIONS_KEPT);
}

// A rule's amount: a raise of a limit, or the most an auto-approval approves.
function ruleAmount(spec) {
  if (spec.amount !== undefined && spec.amount !== null) return "+" + money(spec.amount);
  if (spec.max_price !== undefined && spec.max_price !== null) return "up to " + money(spec.max_price);
  return "";
}

function fromEvent(event) {
  const kind = event.type.replace(/^hold\./, "");
  const spec = event.spec || {};
  const detail = event.outcome ? `as ${event.outcome}` : event.cause ? `(${event.cause})`
    : spec.kind ? `${spec.kind}${event.until ? " until " + clock(timeMs(event.until)) : ""}` : "";
  return {
    time: timeMs(event.at), what: kind, detail, hold: event.hold ?? event.rule ?? "",
    who: event.agent ?? "", route: event.route ?? spec.account ?? spec.agent ?? spec.principal ?? "",
    amount: event.type.startsWith("rule.") ? ruleAmount(spec) : moneyOf(event, "price"),
    by: event.automatic ? `rule ${event.rule}` : event.by ?? "", reason: event.reason ?? spec.reason ?? "",
  };
}

function renderDecisions() {
  const shown = state.decisions.slice().reverse();
  $("decisions").tBodies[0].replaceChildren(...shown.map((d) => el("tr", {},
    el("td", { className: "mono" }, Number.isFinite(d.time) ? clock(d.time) : ""),
    el("td", {}, el("span", { className: "event " + d.what }, d.what), " ", el("span", { className: "muted" }, d.detail)),
    el("td", { className: "mono" }, d.hold),
    el("td", {}, el("div", {}, d.who), el("div", { className: "muted mono" }, d.route)),
    el("td", { className: "num" }, d.amount),
    el("td", {}, el("div", {}, d.by), el("div", { className: "muted" }, d.reason)))));
  const empty = document.querySelector('.empty[data-for="decisions"]');
  empty.hidden = shown.length > 0;
}

// --- start ------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", async () => {
  $("login").addEventListener("submit", signIn);
  $("signout").addEventListener("click", signOut);
  $("tenant").addEventListener("change", chooseTenant);
  $("refresh").addEventListener("click", () => refresh());
  $("interval").addEventListener("change", schedule);
  $("reconcile").addEventListener("click", reconcileNow);
  $("filter-agent").addEventListener("change", (e) => chooseFilter("agent", e.target));
  $("filter-route").addEventListener("change", (e) => chooseFilter("route", e.target));
  $("filter-reason").addEventListener("change", (e) => chooseFilter("reason", e.target));
  $("select-shown").addEventListener("change", selectShown);
  $("bulk-approve").addEventListener("click", () => decideSelected("approve"));
  $("bulk-reject").addEventListener("click", () => decideSelected("reject"));
  $("rule-form").addEventListener("submit", setRule);
  $("rule-kind").addEventListener("change", chooseRuleKind);
  $("rule-who-kind").addEventListener("change", fillRuleNames);
  $("refusal-minutes").addEventListener("change", () => refresh(true));
  $("refusal-reason").addEventListener("change", (e) => {
    state.refusalReason = e.target.value;
    if (state.refused) renderRefusals(state.refused);
    labelCells($("refusals"));
  });
  $("escalations").addEventListener("pointerenter", () => {
    clearTimeout(state.leaving);
    state.pointerOnQueue = true;
  });
  $("escalations").addEventListener("pointerleave", () => {
    clearTimeout(state.leaving);
    state.leaving = setTimeout(() => {
      state.pointerOnQueue = false;
      settle();
    }, LEAVE_MS);
  });
  $("escalations").addEventListener("focusout", (e) => {
    if (!$("escalations").contains(e.relatedTarget)) settle();
  });
  $("queue-more").addEventListener("click", () => {
    state.queuePages += 1;
    refresh(true);
  });
  $("all-agents").addEventListener("click", () => {
    state.allAgents = !state.allAgents;
    refresh(true);
  });
  $("all-accounts").addEventListener("click", () => {
    state.allAccounts = !state.allAccounts;
    refresh(true);
  });
  if (!state.token) return showApp(false);
  try {
    await loadTenants();
    showApp(true);
    refresh();
  } catch {
    signOut();
  }
});
