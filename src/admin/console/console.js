// The web console: one page that reads and changes the gateway through the
// admin API (/admin/v1) with the admin token the operator enters. The token
// is kept in this tab's sessionStorage only. Every element is built with
// createElement and textContent: no HTML is ever parsed from data.

const TOKEN_KEY = 'mpg-console-token';
const API = '/admin/v1';
const REFRESH_MS = 2000;
/** How long the overview keeps its samples (the chart's span). */
const HISTORY_MS = 5 * 60 * 1000;
/** The span the rate, the status mix and the p99 are computed over. */
const WINDOW_MS = 60 * 1000;

const $ = (id) => document.getElementById(id);

/** A refused admin token: the page has signed out already. */
class SignedOut extends Error {}

/** An error answer of the admin API. */
class ApiError extends Error {
  constructor(status, body) {
    const msg = (body && (body.message || body.error)) || `HTTP ${status}`;
    const field = body && body.details && body.details.field;
    super(field ? `${msg} (${field})` : msg);
    this.status = status;
    this.body = body;
  }
}

// ---------------------------------------------------------------- the token

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** `method path` on the admin API with `tok` (the stored token by default). */
async function request(method, path, body, tok = token()) {
  const headers = { Accept: 'application/json' };
  if (tok) headers.Authorization = `Bearer ${tok}`;
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(API + path, init);
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  return { status: res.status, data };
}

/** Like `request` with the stored token; a 401 signs the page out. */
async function api(method, path, body) {
  if (!token()) {
    signOut('Sign in with an admin token.');
    throw new SignedOut('no token');
  }
  const { status, data } = await request(method, path, body);
  if (status === 401) {
    signOut('The admin token was refused (revoked or unknown): sign in again.');
    throw new SignedOut('401');
  }
  if (status < 200 || status > 299) throw new ApiError(status, data);
  return data;
}

/** Every item of a list, following `next_cursor` (at most `pages` pages). */
async function listAll(path, pages = 20) {
  const out = [];
  let cursor = null;
  for (let i = 0; i < pages; i++) {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api('GET', `${path}${sep}limit=100${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    out.push(...((page && page.data) || []));
    cursor = page && page.next_cursor;
    if (!cursor) break;
  }
  return out;
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  stopTimers();
  showSignIn(message || '');
}

function showSignIn(message) {
  $('nav').hidden = true;
  $('signout').hidden = true;
  $('app').replaceChildren();
  hideNotice();
  $('signin').hidden = false;
  const msg = $('signin-message');
  msg.textContent = message;
  msg.hidden = !message;
  $('signin-token').value = '';
  $('signin-token').focus();
}

async function signIn(event) {
  event.preventDefault();
  const input = $('signin-token');
  const tok = input.value.trim();
  const msg = $('signin-message');
  const button = $('signin-submit') || event.submitter;
  if (!tok) return;
  if (button) button.disabled = true;
  try {
    // Any admin call checks the token; this one changes nothing.
    const { status, data } = await request('GET', '/organizations?limit=1', undefined, tok);
    if (status === 401) {
      msg.textContent = 'That token was refused: it is not a valid admin token.';
      msg.hidden = false;
      input.select();
      return;
    }
    if (status < 200 || status > 299) {
      msg.textContent = `The admin API answered ${status}: ${(data && data.message) || 'try again'}.`;
      msg.hidden = false;
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, tok);
    input.value = '';
    msg.hidden = true;
    $('signin').hidden = true;
    if (!location.hash || location.hash === '#' || location.hash === '#/') {
      location.hash = '#/overview';
    } else {
      route();
    }
  } catch (e) {
    msg.textContent = `The admin API could not be reached: ${e.message}`;
    msg.hidden = false;
  } finally {
    if (button) button.disabled = false;
  }
}

// ---------------------------------------------------------------- DOM helpers

/** An element: `h('td', {class: 'x', dataset: {testid: 'y'}}, 'text', child)`. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A table with a header row; `rows` are arrays of cells (text or nodes). */
function table(testid, headers, rows, empty = 'None.') {
  if (!rows.length) return h('p', { class: 'empty', dataset: { testid: `${testid}-empty` } }, empty);
  const head = h('tr', null, headers.map((t) => h('th', { scope: 'col' }, t)));
  const body = rows.map((r) => {
    const cells = r.cells || r;
    const tr = h('tr', { dataset: r.dataset || {} }, cells.map((c) => h('td', null, c)));
    return tr;
  });
  return h('div', { class: 'scroll' }, h('table', { dataset: { testid } }, h('thead', null, head), h('tbody', null, body)));
}

function label(forId, text) {
  return h('label', { for: forId }, text);
}

function field(id, text, input) {
  input.id = id;
  if (!input.dataset.testid) input.dataset.testid = id;
  return h('div', { class: 'field' }, label(id, text), input);
}

function when(t) {
  if (!t) return '—';
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function duration(seconds) {
  let s = Math.max(0, Math.floor(Number(seconds) || 0));
  const d = Math.floor(s / 86400);
  s -= d * 86400;
  const hh = Math.floor(s / 3600);
  s -= hh * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (d) return `${d}d ${hh}h ${m}m`;
  if (hh) return `${hh}h ${m}m ${s}s`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

function notice(text, kind = 'ok') {
  const n = $('notice');
  n.textContent = text;
  n.className = `message ${kind}`;
  n.hidden = false;
}

function hideNotice() {
  const n = $('notice');
  n.hidden = true;
  n.textContent = '';
}

/** Shows `e` unless it signed the page out. */
function failed(e, what) {
  if (e instanceof SignedOut) return;
  notice(`${what}: ${e.message}`, 'error');
}

/** A button that runs `action` once at a time, reporting its failure. */
function actionButton(text, testid, what, action, cls) {
  const b = h('button', { type: 'button', class: cls, dataset: { testid } }, text);
  b.addEventListener('click', async () => {
    b.disabled = true;
    try {
      await action();
    } catch (e) {
      failed(e, what);
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

/** A form whose submit (button or Enter) runs `action` with its values. */
function form(testid, children, submitText, what, action) {
  const submit = h('button', { type: 'submit', dataset: { testid: `${testid}-submit` } }, submitText);
  const f = h('form', { class: 'inline-form', dataset: { testid }, autocomplete: 'off' }, children, submit);
  f.addEventListener('submit', async (event) => {
    event.preventDefault();
    submit.disabled = true;
    try {
      await action(f);
    } catch (e) {
      failed(e, what);
    } finally {
      submit.disabled = false;
    }
  });
  return f;
}

// ---------------------------------------------------------------- routing

let timers = [];
let generation = 0;

function every(ms, fn) {
  timers.push(setInterval(fn, ms));
}

function stopTimers() {
  timers.forEach(clearInterval);
  timers = [];
  generation++;
}

const PAGES = [
  [/^#\/overview$/, overview, 'overview'],
  [/^#\/routes$/, routes, 'routes'],
  [/^#\/upstreams$/, upstreams, 'upstreams'],
  [/^#\/organizations$/, organizations, 'organizations'],
  [/^#\/organizations\/([^/]+)$/, organization, 'organizations'],
];

async function route() {
  stopTimers();
  hideNotice();
  if (!token()) {
    showSignIn('');
    return;
  }
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('signout').hidden = false;
  const hash = location.hash || '#/overview';
  const found = PAGES.find(([re]) => re.test(hash));
  if (!found) {
    location.hash = '#/overview';
    return;
  }
  const [re, page, nav] = found;
  for (const a of $('nav').querySelectorAll('a')) {
    if (a.dataset.testid === `nav-${nav}`) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  let arg = (hash.match(re) || [])[1] || '';
  try {
    arg = decodeURIComponent(arg);
  } catch {
    // a malformed escape: the id as written
  }
  const app = $('app');
  const mine = generation;
  app.replaceChildren(h('p', { class: 'loading' }, 'Loading…'));
  try {
    await page(app, arg, () => mine === generation);
  } catch (e) {
    if (mine === generation) failed(e, 'Could not load the page');
  }
}

/** The page's title, focusable so a route change moves the focus to it. */
function title(text, testid) {
  return h('h1', { tabindex: '-1', dataset: { testid: testid || 'page-title' } }, text);
}

function mount(app, ...children) {
  app.replaceChildren(...children);
  const h1 = app.querySelector('h1');
  const active = document.activeElement;
  if (h1 && (!active || active === document.body || $('nav').contains(active))) h1.focus({ preventScroll: true });
}

// ---------------------------------------------------------------- overview

/** `[{t, total, byClass, buckets}]`, oldest first. */
let samples = [];

/** Rate, status mix and p99 between an older sample and the newest. */
export function summarize(older, newer) {
  const dt = (newer.t - older.t) / 1000;
  const total = newer.total - older.total;
  const mix = {};
  for (const c of ['2xx', '3xx', '4xx', '5xx']) {
    mix[c] = Math.max(0, (newer.byClass[c] || 0) - (older.byClass[c] || 0));
  }
  return { rate: dt > 0 ? Math.max(0, total) / dt : 0, total: Math.max(0, total), mix, p99: quantile(0.99, older.buckets, newer.buckets) };
}

/** The q-quantile (seconds) of the requests between two cumulative
 * histograms, interpolated in its bucket as Prometheus does; null when no
 * request; Infinity when it is above the last finite bound. */
export function quantile(q, before, after) {
  if (!after || !after.length) return null;
  const prior = new Map((before || []).map(([le, n]) => [le === null ? 'inf' : le, n]));
  const deltas = after.map(([le, n]) => [le, n - (prior.get(le === null ? 'inf' : le) || 0)]);
  const count = deltas[deltas.length - 1][1];
  if (!(count > 0)) return null;
  const rank = q * count;
  let lower = 0;
  let below = 0;
  for (const [le, n] of deltas) {
    if (n >= rank) {
      if (le === null) return Infinity;
      const inBucket = n - below;
      return inBucket > 0 ? lower + (le - lower) * ((rank - below) / inBucket) : le;
    }
    if (le !== null) lower = le;
    below = n;
  }
  return Infinity;
}

function ms(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  if (seconds === Infinity) return 'above the last bucket';
  const v = seconds * 1000;
  return v < 10 ? `${v.toFixed(2)} ms` : `${v.toFixed(0)} ms`;
}

function sampleOf(status) {
  const r = status.requests || {};
  return {
    t: Date.now(),
    total: Number(r.total) || 0,
    byClass: r.by_class || {},
    buckets: Array.isArray(r.duration_buckets) ? r.duration_buckets : [],
  };
}

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

/** The chart's span: the time since the first kept sample, from 1 to 5 minutes. */
function chartSpan(points, now) {
  const first = points.length ? points[0].t : now;
  return Math.min(HISTORY_MS, Math.max(60 * 1000, now - first));
}

function spanText(span) {
  const s = Math.round(span / 1000);
  return s < 120 ? `${s} s` : `${Math.round(s / 60)} minutes`;
}

/** The request rate between consecutive samples over the kept span. */
function chart(points) {
  const W = 600;
  const H = 120;
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'data-testid': 'ov-chart', preserveAspectRatio: 'none' });
  const rates = [];
  for (let i = 1; i < points.length; i++) {
    const dt = (points[i].t - points[i - 1].t) / 1000;
    if (dt > 0) rates.push({ t: points[i].t, r: Math.max(0, points[i].total - points[i - 1].total) / dt });
  }
  const max = Math.max(1, ...rates.map((p) => p.r));
  const now = Date.now();
  const span = chartSpan(points, now);
  const x = (t) => W - ((now - t) / span) * W;
  const y = (r) => H - 4 - (r / max) * (H - 16);
  const titleEl = svg('title');
  titleEl.textContent = `Requests per second over the last ${spanText(span)} (peak ${max.toFixed(1)}/s)`;
  root.append(titleEl);
  root.append(svg('line', { x1: 0, y1: H - 4, x2: W, y2: H - 4, class: 'axis' }));
  if (rates.length) {
    const line = rates.map((p) => `${x(p.t).toFixed(1)},${y(p.r).toFixed(1)}`).join(' ');
    root.append(svg('polyline', { points: line, class: 'rate-line', 'data-testid': 'ov-chart-line' }));
  }
  return { root, peak: max };
}

function stat(name, testid, value, cls) {
  return h('div', { class: 'stat' }, h('dt', null, name), h('dd', { class: cls || null, dataset: { testid } }, value));
}

async function overview(app, _arg, current) {
  let first = true;
  const render = async () => {
    let status;
    try {
      status = await api('GET', '/status');
    } catch (e) {
      if (!current()) return;
      if (first) mount(app, title('Overview'));
      first = false;
      failed(e, 'Could not read the status');
      return;
    }
    if (!current()) return;
    samples.push(sampleOf(status));
    const cut = Date.now() - HISTORY_MS;
    samples = samples.filter((s) => s.t >= cut);
    // A restarted gateway's counters begin again: keep only the samples since.
    const last = samples[samples.length - 1];
    samples = samples.filter((s) => s.total <= last.total);
    const newest = samples[samples.length - 1];
    const older = samples.find((s) => s.t >= newest.t - WINDOW_MS) || newest;
    const sum = summarize(older, newest);
    const span = Math.round((newest.t - older.t) / 1000);

    const cfg = status.config || {};
    const reload = cfg.last_reload;
    const reloadText = reload
      ? `${reload.outcome} at ${when(reload.at)}${reload.problems && reload.problems.length ? `: ${reload.problems.join('; ')}` : ''}`
      : 'none since start';
    const limiter = status.rate_limiter || {};
    const limiterOk = limiter.healthy !== false;
    const limiterText = `${limiter.backend || '?'}: ${limiterOk ? 'healthy' : 'unhealthy'}${
      limiter.nodes_down && limiter.nodes_down.length ? ` (down: ${limiter.nodes_down.join(', ')})` : ''
    }${limiter.instances ? `, ${limiter.instances} instance${limiter.instances === 1 ? '' : 's'}` : ''}`;
    const mixTotal = sum.total;
    const mixText = mixTotal
      ? ['2xx', '3xx', '4xx', '5xx'].map((c) => `${c} ${((sum.mix[c] / mixTotal) * 100).toFixed(0)}%`).join(' · ')
      : 'no requests';
    const mixBar = h('div', { class: 'mix-bar', 'aria-hidden': 'true' });
    if (mixTotal) {
      for (const c of ['2xx', '3xx', '4xx', '5xx']) {
        if (!sum.mix[c]) continue;
        const part = h('span', { class: `mix-${c}` });
        part.style.flexGrow = String(sum.mix[c]);
        mixBar.append(part);
      }
    }
    const since = span ? `over the last ${span} s` : 'first sample';
    const stats = h(
      'dl',
      { class: 'stats' },
      stat('Version', 'ov-version', status.version || '—'),
      stat('Uptime', 'ov-uptime', `${duration(status.uptime_seconds)} (since ${when(status.started_at)})`),
      stat('Config', 'ov-config-path', `${cfg.path || '—'}, loaded ${when(cfg.loaded_at)}`),
      stat('Last reload', 'ov-last-reload', reloadText, reload && reload.outcome === 'failed' ? 'bad' : ''),
      stat('Store', 'ov-store', status.store || '—', status.store === 'ok' ? 'good' : 'bad'),
      stat('Rate limiter', 'ov-limiter', limiterText, limiterOk ? 'good' : 'bad'),
      stat('Requests', 'ov-rate', `${sum.rate.toFixed(2)}/s ${since} (${Number((status.requests || {}).total) || 0} since start)`),
      stat('Status mix', 'ov-mix', [h('span', null, mixText), mixBar]),
      stat('p99 latency', 'ov-p99', `${ms(sum.p99)} ${since}`),
    );
    const drawn = chart(samples);
    const chartBox = h(
      'figure',
      { class: 'chart-box' },
      h('div', { class: 'chart-peak', dataset: { testid: 'ov-chart-peak' } }, `peak ${drawn.peak.toFixed(1)}/s`),
      drawn.root,
      h('figcaption', null, `Requests per second over the last ${spanText(chartSpan(samples, Date.now()))} (up to ${HISTORY_MS / 60000} minutes, sampled every ${REFRESH_MS / 1000} s while this page is open)`),
    );
    const page = [title('Overview'), stats, chartBox];
    if (first) {
      mount(app, ...page);
      first = false;
    } else {
      app.replaceChildren(...page);
    }
    app.dataset.updated = String(newest.t);
  };
  await render();
  if (current()) every(REFRESH_MS, render);
}

// ---------------------------------------------------------------- routes

async function routes(app, _arg, current) {
  const list = await listAll('/routes');
  if (!current()) return;
  const rows = list.map((r) => ({
    dataset: { testid: 'route-row' },
    cells: [
      h('span', { class: 'method' }, r.method),
      h('code', null, r.path),
      r.auth || '—',
      r.scope || '—',
      r.rate_limit || '—',
      r.upstream || '—',
    ],
  }));
  mount(app, title('Routes'), h('p', { class: 'hint' }, `${list.length} routes in the running configuration.`),
    table('routes-table', ['Method', 'Path', 'Auth', 'Scope', 'Rate limit', 'Upstream'], rows, 'No routes.'));
}

// ---------------------------------------------------------------- upstreams

const STATES = {
  in_rotation: ['in rotation', 'good'],
  ejected: ['ejected (out of rotation)', 'bad'],
  probing: ['probing (out of rotation)', 'warn'],
};

async function upstreams(app, _arg, current) {
  let first = true;
  const render = async () => {
    let list;
    try {
      list = await listAll('/upstreams');
    } catch (e) {
      if (current()) failed(e, 'Could not read the upstreams');
      return;
    }
    if (!current()) return;
    const blocks = list.map((u) => {
      const name = u.name;
      let body;
      if (u.builtin) {
        body = h('p', { class: 'hint' }, 'Built in: served by the gateway itself.');
      } else {
        const rows = (u.targets || []).map((t) => {
          const [text, cls] = STATES[t.state] || [t.state, 'warn'];
          return {
            dataset: { testid: 'target-row', upstream: name, url: t.url, state: t.state },
            cells: [
              h('code', null, t.url),
              h('span', { class: `badge ${cls}`, dataset: { testid: 'target-state' } }, text),
              String(t.in_flight ?? 0),
              String(t.failures ?? 0),
              h('span', { class: 'wrap', dataset: { testid: 'target-error' } }, t.last_error || '—'),
            ],
          };
        });
        body = table(`targets-${name}`, ['Target', 'State', 'In flight', 'Failures', 'Last error'], rows, 'No targets.');
      }
      return h('section', { class: 'card', dataset: { testid: `upstream-${name}` } }, h('h2', null, name), body);
    });
    const page = [
      title('Upstreams'),
      h('p', { class: 'hint' }, `Refreshed every ${REFRESH_MS / 1000} s.`),
      ...(blocks.length ? blocks : [h('p', { class: 'empty' }, 'No upstreams.')]),
    ];
    if (first) mount(app, ...page);
    else app.replaceChildren(...page);
    first = false;
  };
  await render();
  if (current()) every(REFRESH_MS, render);
}

// ---------------------------------------------------------------- organizations

function orgLink(id) {
  return h('a', { href: `#/organizations/${encodeURIComponent(id)}`, dataset: { testid: `org-link-${id}` } }, id);
}

async function organizations(app, _arg, current) {
  const list = await listAll('/organizations');
  if (!current()) return;
  const rows = list.map((o) => ({ dataset: { testid: 'org-row', id: o.id }, cells: [orgLink(o.id), o.name || '—', when(o.created_at)] }));
  const create = form(
    'org-form',
    [
      field('org-id', 'Id', h('input', { name: 'id', required: true, spellcheck: 'false', placeholder: 'acme' })),
      field('org-name', 'Name (optional)', h('input', { name: 'name', placeholder: 'Acme Inc.' })),
    ],
    'Create organization',
    'Could not create the organization',
    async (f) => {
      const id = f.elements.id.value.trim();
      const name = f.elements.name.value.trim();
      const body = { id };
      if (name) body.name = name;
      await api('POST', '/organizations', body);
      location.hash = `#/organizations/${encodeURIComponent(id)}`;
    },
  );
  mount(
    app,
    title('Organizations'),
    h('section', { class: 'card' }, h('h2', null, 'New organization'), create),
    h('section', { class: 'card' }, h('h2', null, `${list.length} organization${list.length === 1 ? '' : 's'}`),
      table('orgs-table', ['Id', 'Name', 'Created'], rows, 'No organizations yet.')),
  );
}

function credits(c) {
  if (!c) return 'unlimited';
  const refill = c.refill ? `, +${c.refill.amount} every ${c.refill.interval}` : '';
  return `${c.remaining}${refill}`;
}

function keyState(k) {
  const state = k.enabled === false && k.status === 'active' ? 'disabled' : k.status;
  const cls = state === 'active' ? 'good' : state === 'revoked' ? 'bad' : 'warn';
  return h('span', { class: `badge ${cls}`, dataset: { testid: 'key-status' } }, state);
}

/** The secret of a key just made: shown once, with a copy button. */
function secretPanel(record, verb) {
  const code = h('code', { class: 'secret', dataset: { testid: 'key-secret' } }, record.key);
  const status = h('span', { class: 'hint', role: 'status', dataset: { testid: 'key-copy-status' } });
  const copy = h('button', { type: 'button', dataset: { testid: 'key-copy' } }, 'Copy');
  copy.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(record.key);
      status.textContent = 'Copied.';
    } catch {
      const range = document.createRange();
      range.selectNodeContents(code);
      const sel = getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      status.textContent = 'Copying was refused: the key is selected, copy it by hand.';
    }
  });
  const done = h('button', { type: 'button', class: 'secondary', dataset: { testid: 'key-secret-done' } }, 'Done');
  const panel = h(
    'section',
    { class: 'card secret-panel', role: 'alert', dataset: { testid: 'key-secret-panel' } },
    h('h2', null, `Key “${record.name}” ${verb}`),
    h('p', null, 'Copy the secret now: it is shown this once and cannot be read again.'),
    h('div', { class: 'secret-row' }, code, copy, done),
    status,
  );
  done.addEventListener('click', () => panel.remove());
  return panel;
}

async function organization(app, id, current) {
  const org = await api('GET', `/organizations/${encodeURIComponent(id)}`);
  const path = `/organizations/${encodeURIComponent(id)}`;
  // The configured roles and scopes come with the gateway's status.
  const [members, keys, audit, status] = await Promise.all([
    listAll(`${path}/members`),
    listAll(`${path}/keys`),
    api('GET', `${path}/audit-events?limit=50`),
    api('GET', '/status'),
  ]);
  const ROLES = status.roles;
  const SCOPES = status.scopes;
  if (!current()) return;
  const reload = async (secret) => {
    if (!current()) return;
    const focusId = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.testid : null;
    await organization(app, id, current);
    if (secret && current()) {
      const slot = app.querySelector('[data-testid="secret-slot"]');
      slot.replaceChildren(secret);
      secret.querySelector('[data-testid="key-copy"]').focus();
    } else if (focusId) {
      const again = app.querySelector(`[data-testid="${CSS.escape(focusId)}"]`);
      if (again) again.focus();
    }
  };

  // Members, with their sessions on demand.
  const memberRows = members.map((m) => {
    const sessionsBox = h('div', { class: 'sessions', dataset: { testid: `sessions-${m.user_id}` } });
    const show = actionButton('Sessions', `sessions-button-${m.user_id}`, 'Could not list the sessions', async () => {
      const list = await listAll(`/users/${encodeURIComponent(m.user_id)}/sessions`);
      const rows = list.map((s) => ({
        dataset: { testid: 'session-row', id: s.id },
        cells: [
          h('code', null, s.id),
          when(s.created_at),
          when(s.expires_at),
          actionButton('Revoke', `session-revoke-${s.id}`, 'Could not revoke the session', async () => {
            if (!confirm(`Revoke session ${s.id} of ${m.user_id}? Its token is refused within a second.`)) return;
            await api('DELETE', `/sessions/${encodeURIComponent(s.id)}`);
            notice(`Session ${s.id} revoked.`);
            show.click();
          }, 'danger'),
        ],
      }));
      sessionsBox.replaceChildren(table(`sessions-table-${m.user_id}`, ['Session', 'Created', 'Expires', ''], rows, 'No open sessions.'));
      show.setAttribute('aria-expanded', 'true');
    }, 'secondary');
    show.setAttribute('aria-expanded', 'false');
    show.setAttribute('aria-controls', `sessions-${m.user_id}`);
    sessionsBox.id = `sessions-${m.user_id}`;
    return {
      dataset: { testid: 'member-row', user: m.user_id },
      cells: [m.user_id, m.role, h('div', null, show, sessionsBox)],
    };
  });
  const roleSelect = h('select', { name: 'role' }, ROLES.map((r) => h('option', { value: r, selected: r === 'member' }, r)));
  const addMember = form(
    'member-form',
    [
      field('member-user', 'User id', h('input', { name: 'user', required: true, spellcheck: 'false', placeholder: 'alice' })),
      field('member-email', 'Email (new users, optional)', h('input', { name: 'email', type: 'email', placeholder: 'alice@example.com' })),
      field('member-role', 'Role', roleSelect),
    ],
    'Add member',
    'Could not add the member',
    async (f) => {
      const user = f.elements.user.value.trim();
      const email = f.elements.email.value.trim();
      const role = f.elements.role.value;
      // The user is made first when it does not exist yet.
      const { status } = await request('GET', `/users/${encodeURIComponent(user)}`);
      if (status === 401) return api('GET', `/users/${encodeURIComponent(user)}`);
      if (status === 404) {
        const body = { id: user };
        if (email) body.email = email;
        await api('POST', '/users', body);
      }
      await api('PUT', `${path}/members/${encodeURIComponent(user)}`, { role });
      notice(`${user} is ${role} of ${id}.`);
      await reload();
    },
  );

  // Keys.
  const keyRows = keys.map((k) => {
    const active = k.status === 'active';
    const actions = active
      ? h(
          'div',
          { class: 'actions' },
          actionButton('Rotate', `key-rotate-${k.id}`, 'Could not rotate the key', async () => {
            if (!confirm(`Rotate key “${k.name}”? A new secret replaces it.`)) return;
            const made = await api('POST', `/keys/${encodeURIComponent(k.id)}/rotate`);
            notice(`Key “${k.name}” rotated.`);
            await reload(secretPanel(made, 'rotated'));
          }, 'secondary'),
          actionButton('Revoke', `key-revoke-${k.id}`, 'Could not revoke the key', async () => {
            if (!confirm(`Revoke key “${k.name}” (${k.prefix})? It is refused from then on.`)) return;
            await api('POST', `/keys/${encodeURIComponent(k.id)}/revoke`);
            notice(`Key “${k.name}” revoked.`);
            await reload();
          }, 'danger'),
        )
      : '—';
    return {
      dataset: { testid: 'key-row', id: k.id, status: k.status },
      cells: [
        k.name,
        h('code', null, k.prefix || '—'),
        keyState(k),
        (k.scopes || []).join(', ') || '—',
        h('span', { class: 'owner' }, k.user_id || '—'),
        when(k.last_used_at),
        credits(k.credits),
        actions,
      ],
    };
  });
  const userSelect = h('select', { name: 'user', required: true }, members.map((m) => h('option', { value: m.user_id }, `${m.user_id} (${m.role})`)));
  const scopeBoxes = h(
    'fieldset',
    { class: 'scopes' },
    h('legend', null, 'Scopes'),
    SCOPES.map((s) => {
      const idFor = `key-scope-${s.replace(':', '-')}`;
      return h('span', { class: 'check' }, h('input', { type: 'checkbox', id: idFor, name: 'scope', value: s, dataset: { testid: idFor } }), label(idFor, s));
    }),
  );
  const createKey = members.length
    ? form(
        'key-form',
        [
          field('key-name', 'Name', h('input', { name: 'name', required: true, placeholder: 'ci' })),
          field('key-user', 'For user', userSelect),
          scopeBoxes,
          field('key-credits', 'Credits (optional)', h('input', { name: 'credits', type: 'number', min: '0', step: '1' })),
        ],
        'Create key',
        'Could not create the key',
        async (f) => {
          const scopes = [...f.querySelectorAll('input[name="scope"]:checked')].map((c) => c.value);
          const body = { user_id: f.elements.user.value, name: f.elements.name.value.trim(), scopes };
          const c = f.elements.credits.value.trim();
          if (c) body.credits = { remaining: Number(c) };
          const made = await api('POST', `${path}/keys`, body);
          notice(`Key “${made.name}” created.`);
          await reload(secretPanel(made, 'created'));
        },
      )
    : h('p', { class: 'hint' }, 'Add a member first: a key belongs to a member.');

  // The audit trail.
  const events = (audit && audit.data) || [];
  const auditRows = events.map((e) => ({
    dataset: { testid: 'audit-row', action: e.action },
    cells: [when(e.at), h('code', null, e.action), e.key_id || e.subject || '—', e.actor || '—', e.client || '—'],
  }));

  mount(
    app,
    h('p', { class: 'crumbs' }, h('a', { href: '#/organizations' }, 'Organizations'), ' / ', org.id),
    title(org.name && org.name !== org.id ? `${org.name} (${org.id})` : org.id, 'org-title'),
    h('div', { dataset: { testid: 'secret-slot' } }),
    h('section', { class: 'card', dataset: { testid: 'members' } }, h('h2', null, 'Members'),
      table('members-table', ['User', 'Role', 'Sessions'], memberRows, 'No members yet.'),
      h('h3', null, 'Add a member'), addMember),
    h('section', { class: 'card', dataset: { testid: 'keys' } }, h('h2', null, 'API keys'),
      table('keys-table', ['Name', 'Prefix', 'State', 'Scopes', 'User', 'Last used', 'Credits', ''], keyRows, 'No keys yet.'),
      h('h3', null, 'Create a key'), createKey),
    h('section', { class: 'card', dataset: { testid: 'audit' } }, h('h2', null, 'Audit trail'),
      h('p', { class: 'hint' }, 'Newest first, the last 50 events.'),
      table('audit-table', ['At', 'Action', 'Key or subject', 'Actor', 'Client'], auditRows, 'No events yet.')),
  );
}

// ---------------------------------------------------------------- start

function start() {
  $('signin-form').addEventListener('submit', signIn);
  $('signout').addEventListener('click', () => {
    signOut('Signed out.');
    history.replaceState(null, '', location.pathname);
  });
  window.addEventListener('hashchange', route);
  route();
}

start();
