// Drives the admin web console in headless Chromium, as an operator would,
// against a gateway that tests/console.rs started. Exits 0 when every step
// held; otherwise prints the failed step and exits 1 (with a screenshot of
// the page in the screenshot directory as failure.png).
//
// Environment (set by tests/console.rs):
//   ADMIN_URL      http://127.0.0.1:PORT, the admin listener
//   ADMIN_TOKEN    an admin token (mpga_…); ADMIN_TOKEN_ID its id (adm_…)
//   GATEWAY_URL    http://127.0.0.1:PORT, the data plane
//   MPG_BIN, MPG_CONFIG  the gateway binary and its config, for admin commands
//   DEAD_PATH      a data-plane path whose upstream (DEAD_UPSTREAM) has no listener
//   SHOTS          where screenshots go (<page>-<width>.png)
//   CHROMIUM       the browser (default /usr/bin/chromium)
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const ADMIN_URL = env('ADMIN_URL');
const TOKEN = env('ADMIN_TOKEN');
const TOKEN_ID = env('ADMIN_TOKEN_ID');
const GATEWAY_URL = env('GATEWAY_URL');
const MPG_BIN = env('MPG_BIN');
const MPG_CONFIG = env('MPG_CONFIG');
const DEAD_PATH = env('DEAD_PATH');
const DEAD_UPSTREAM = env('DEAD_UPSTREAM');
const SHOTS = env('SHOTS');
const CHROMIUM = env('CHROMIUM', '/usr/bin/chromium');
const CONSOLE = `${ADMIN_URL}/console/`;
const WIDTHS = [1280, 390];

mkdirSync(SHOTS, { recursive: true });

let step = 'start';
const log = (msg) => console.log(`[console] ${msg}`);
function check(cond, msg) {
  if (!cond) throw new Error(`${step}: ${msg}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** `curl` (the real binary) on the data plane: the status code. */
function curl(path, key) {
  const args = ['-s', '-o', '/dev/null', '-w', '%{http_code}', '--max-time', '5'];
  if (key) args.push('-H', `Authorization: Bearer ${key}`);
  args.push(`${GATEWAY_URL}${path}`);
  return Number(execFileSync('curl', args, { encoding: 'utf8' }).trim());
}

/** An admin API call from here (not from the page), with the token. */
async function admin(method, path, body) {
  const res = await fetch(`${ADMIN_URL}/admin/v1${path}`, {
    method,
    headers: { Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, data: text ? JSON.parse(text) : null };
}

/** The data plane's counters on /metrics: every sample line of the named families. */
async function dataPlaneCounters() {
  const text = await (await fetch(`${ADMIN_URL}/metrics`)).text();
  const families = ['mpg_requests_total', 'mpg_rate_limit_decisions_total', 'mpg_key_cache_lookups_total'];
  return text
    .split('\n')
    .filter((l) => families.some((f) => l.startsWith(`${f}{`) || l.startsWith(`${f} `)))
    .sort()
    .join('\n');
}

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true });
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: ADMIN_URL });
const page = await context.newPage();
page.setDefaultTimeout(10_000);

// What the page did: errors, CSP violations, every request.
const problems = [];
const requests = [];
// A refused call is logged by Chromium as a failed resource load; those are expected
// (the wrong token, the revoked admin token, a user looked up before it exists).
const expectedLoadError = /^Failed to load resource: the server responded with a status of (401|404)/;
page.on('console', (msg) => {
  const text = msg.text();
  if (/Content Security Policy|Refused to (load|execute|apply|connect|frame)/i.test(text)) {
    problems.push(`CSP violation: ${text}`);
  } else if (msg.type() === 'error' && !expectedLoadError.test(text)) {
    problems.push(`console error: ${text}`);
  }
});
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('dialog', (d) => d.accept());
page.on('request', (r) => {
  requests.push({ method: r.method(), url: r.url(), auth: r.headers().authorization || null });
});

/** Screenshots of the page as it is, at each width; at 390 px the page must not scroll sideways. */
async function shoot(name) {
  for (const width of WIDTHS) {
    await page.setViewportSize({ width, height: width === 390 ? 844 : 900 });
    await sleep(200);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 1, `${name} at ${width} px is ${overflow} px wider than the window`);
    await page.screenshot({ path: join(SHOTS, `${name}-${width}.png`), fullPage: true });
  }
  await page.setViewportSize({ width: 1280, height: 900 });
  log(`screenshots of ${name}`);
}

const byTest = (id) => page.locator(`[data-testid="${id}"]`);

try {
  step = 'open';
  await page.goto(CONSOLE);
  await byTest('signin-form').waitFor();
  check(await byTest('nav-overview').isHidden(), 'the pages are shown before sign-in');

  step = 'a wrong token is refused at sign-in';
  await byTest('signin-token').fill('mpga_notarealtokennotarealtokennotareal');
  await byTest('signin-token').press('Enter');
  await page.locator('[data-testid="signin-message"]:visible').waitFor();
  check(/refused/i.test(await byTest('signin-message').textContent()), 'no refusal message');
  check(await byTest('nav-overview').isHidden(), 'signed in with a wrong token');
  check((await page.evaluate(() => sessionStorage.length)) === 0, 'a wrong token was kept');

  step = 'sign in';
  await byTest('signin-token').fill(TOKEN);
  await byTest('signin-submit').click();
  await byTest('ov-version').waitFor();
  check(page.url().endsWith('#/overview'), `signed in to ${page.url()}`);
  check(
    (await page.evaluate(() => sessionStorage.getItem('mpg-console-token'))) === TOKEN,
    'the token is not in sessionStorage',
  );
  check(
    (await page.evaluate(() => localStorage.length + document.cookie.length)) === 0,
    'something was kept outside sessionStorage',
  );

  step = 'overview';
  check(/\d+\.\d+\.\d+/.test(await byTest('ov-version').textContent()), 'no version');
  check((await byTest('ov-config-path').textContent()).includes(MPG_CONFIG), 'the config path is not shown');
  check(/ok/.test(await byTest('ov-store').textContent()), 'the store is not shown ok');
  check(/healthy/.test(await byTest('ov-limiter').textContent()), 'the limiter is not shown healthy');
  await byTest('ov-rate').waitFor();
  await byTest('ov-p99').waitFor();

  step = 'the console costs the data plane nothing';
  const before = await dataPlaneCounters();
  const statusCalls = () => requests.filter((r) => r.url.endsWith('/admin/v1/status')).length;
  const callsBefore = statusCalls();
  await sleep(10_000);
  const after = await dataPlaneCounters();
  check(statusCalls() - callsBefore >= 4, `the overview refreshed ${statusCalls() - callsBefore} times in 10 s`);
  check(before === after, `the data plane's counters changed:\n${before}\n---\n${after}`);
  await page.locator('[data-testid="ov-chart-line"]').waitFor({ state: 'attached' });

  step = 'routes';
  await byTest('nav-routes').click();
  await byTest('routes-table').waitFor();
  const clusters = page.locator('[data-testid="route-row"]', { hasText: '/api/v1/clusters' }).first();
  check((await clusters.textContent()).includes('clusters:read'), 'the clusters route shows no scope');
  check((await page.locator('[data-testid="route-row"]', { hasText: DEAD_PATH }).count()) === 1, `no route ${DEAD_PATH}`);
  await shoot('routes');

  step = 'create an organization';
  await byTest('nav-organizations').click();
  await byTest('org-form').waitFor();
  await byTest('org-id').fill('acme');
  await byTest('org-name').fill('Acme Inc.');
  await byTest('org-name').press('Enter');
  await byTest('org-title').waitFor();
  check(page.url().endsWith('#/organizations/acme'), `after create: ${page.url()}`);
  check((await admin('GET', '/organizations/acme')).status === 200, 'the organization was not made');

  step = 'add a member, making the user';
  await byTest('member-user').fill('alice');
  await byTest('member-email').fill('alice@example.com');
  await byTest('member-role').selectOption('owner');
  await byTest('member-user').press('Enter');
  await page.locator('[data-testid="member-row"][data-user="alice"]').waitFor();
  check((await admin('GET', '/users/alice')).status === 200, 'the user was not made');
  const members = (await admin('GET', '/organizations/acme/members')).data.data;
  check(members.some((m) => m.user_id === 'alice' && m.role === 'owner'), 'no owner membership');

  step = 'create a key; its secret is shown once';
  await byTest('key-name').fill('ci');
  await byTest('key-user').selectOption('alice');
  await byTest('key-scope-clusters-read').check();
  await byTest('key-name').press('Enter');
  await byTest('key-secret').waitFor();
  const secret = (await byTest('key-secret').textContent()).trim();
  check(/^mpg_/.test(secret), `the secret shown is ${secret}`);
  await byTest('key-copy').click();
  await page.locator('[data-testid="key-copy-status"]', { hasText: 'Copied' }).waitFor();
  check((await page.evaluate(() => navigator.clipboard.readText())) === secret, 'the clipboard does not hold the key');
  const row = page.locator('[data-testid="key-row"]', { hasText: 'ci' });
  await row.waitFor();
  check((await row.getAttribute('data-status')) === 'active', 'the key is not listed active');
  check((await row.textContent()).includes('clusters:read'), 'the key row shows no scope');
  const keyId = await row.getAttribute('data-id');
  const prefix = (await admin('GET', `/keys/${keyId}`)).data.prefix;
  check((await row.textContent()).includes(prefix), 'the key row shows no prefix');
  await byTest('key-secret-done').click();
  check((await byTest('key-secret').count()) === 0, 'the secret is still shown');
  check(!(await page.content()).includes(secret), 'the secret is still in the page');
  const clustersPath = '/api/v1/clusters?organization_id=acme';
  check(curl(clustersPath, secret) === 200, 'the new key is refused by the gateway');

  step = 'revoke the key from the page';
  await byTest(`key-revoke-${keyId}`).click();
  await page.locator(`[data-testid="key-row"][data-id="${keyId}"][data-status="revoked"]`).waitFor();
  const deadline = Date.now() + 1000;
  let got = curl(clustersPath, secret);
  while (got !== 401 && Date.now() < deadline) {
    await sleep(50);
    got = curl(clustersPath, secret);
  }
  check(got === 401, `the revoked key got ${got} from the gateway, not 401`);
  log('the revoked key is refused (401) through the gateway');

  step = 'the revocation is in the audit trail';
  await page.locator('[data-testid="audit-row"][data-action="api_key.revoked"]', { hasText: keyId }).waitFor();

  step = 'revoke a session';
  const session = await admin('POST', '/sessions', { user_id: 'alice', ttl_seconds: 3600 });
  check(session.status === 201, `POST /sessions: ${session.status}`);
  const sessionId = session.data.id;
  await byTest('sessions-button-alice').click();
  await page.locator(`[data-testid="session-row"][data-id="${sessionId}"]`).waitFor();
  await byTest(`session-revoke-${sessionId}`).click();
  await page.locator(`[data-testid="session-row"][data-id="${sessionId}"]`).waitFor({ state: 'detached' });
  const open = (await admin('GET', '/users/alice/sessions')).data.data;
  check(!open.some((s) => s.id === sessionId && !s.revoked_at), 'the session is still open');

  step = 'rotate a key';
  await byTest('key-name').fill('deploy');
  await byTest('key-user').selectOption('alice');
  await byTest('key-scope-clusters-read').check();
  await byTest('key-scope-clusters-write').check();
  await byTest('key-form-submit').click();
  await byTest('key-secret').waitFor();
  await byTest('key-secret-done').click();
  const deployRow = page.locator('[data-testid="key-row"]', { hasText: 'deploy' }).first();
  const deployId = await deployRow.getAttribute('data-id');
  await byTest(`key-rotate-${deployId}`).click();
  await byTest('key-secret').waitFor();
  const rotated = (await byTest('key-secret').textContent()).trim();
  check(/^mpg_/.test(rotated), 'no new secret after rotate');
  await byTest('key-secret-done').click();
  await page.locator('[data-testid="audit-row"][data-action="api_key.rotated"]').first().waitFor();

  step = 'keyboard: focus is visible';
  await page.locator('[data-testid="org-title"]').focus();
  await page.keyboard.press('Tab');
  const outline = await page.evaluate(() => {
    const s = getComputedStyle(document.activeElement);
    return { tag: document.activeElement.tagName, style: s.outlineStyle, width: s.outlineWidth };
  });
  check(outline.style !== 'none' && outline.width !== '0px', `no focus outline on ${outline.tag}`);
  await page.evaluate(() => document.activeElement.blur());
  await shoot('organization');

  step = 'organizations';
  await byTest('nav-organizations').click();
  await page.locator('[data-testid="org-row"][data-id="acme"]').waitFor();
  await shoot('organizations');

  step = 'a target out of rotation';
  const codes = [];
  for (let i = 0; i < 4; i++) codes.push(curl(DEAD_PATH));
  check(codes.every((c) => c >= 500), `requests to the stopped upstream got ${codes}`);
  await byTest('nav-upstreams').click();
  await byTest(`upstream-${DEAD_UPSTREAM}`).waitFor();
  const dead = page.locator(`[data-testid="target-row"][data-upstream="${DEAD_UPSTREAM}"]`);
  await page.waitForFunction(
    (name) => {
      const r = document.querySelector(`[data-testid="target-row"][data-upstream="${name}"]`);
      return r && ['ejected', 'probing'].includes(r.dataset.state);
    },
    DEAD_UPSTREAM,
    { timeout: 10_000 },
  );
  check(/out of rotation/.test(await dead.textContent()), 'the target is not shown out of rotation');
  check(Number((await dead.locator('td').nth(3).textContent()).trim()) >= 1, 'no failures shown');
  const live = page.locator('[data-testid="target-row"][data-upstream="clusters"]').first();
  check((await live.getAttribute('data-state')) === 'in_rotation', 'the live target is not in rotation');
  await shoot('upstreams');

  step = 'the overview shows traffic';
  await byTest('nav-overview').click();
  await byTest('ov-version').waitFor();
  const until = Date.now() + 6000;
  while (Date.now() < until) {
    curl(clustersPath, rotated);
    curl(clustersPath, rotated);
    curl(clustersPath);
    await sleep(150);
  }
  await page.waitForFunction(() => /[1-9]/.test(document.querySelector('[data-testid="ov-rate"]').textContent.split('/s')[0]));
  await sleep(2500);
  check(/4xx [1-9]/.test(await byTest('ov-mix').textContent()), 'the status mix shows no 4xx');
  check(/ms/.test(await byTest('ov-p99').textContent()), 'no p99');
  await shoot('overview');

  step = 'a revoked admin token signs the page out';
  execFileSync(MPG_BIN, ['--config', MPG_CONFIG, 'admin-tokens', 'revoke', TOKEN_ID], { stdio: 'ignore' });
  // The upstreams page refreshes every 2 s: its next call is refused.
  await page.locator('[data-testid="signin-message"]:visible').waitFor({ timeout: 8000 });
  check(/refused/i.test(await byTest('signin-message').textContent()), 'no message on sign-out');
  check(await byTest('nav-overview').isHidden(), 'the pages are still shown');
  check((await page.evaluate(() => sessionStorage.length)) === 0, 'the token is still kept');
  await shoot('signin');

  step = 'what the page loaded and sent';
  const origin = new URL(ADMIN_URL).origin;
  const foreign = requests.filter((r) => !r.url.startsWith(`${origin}/`) && !r.url.startsWith('data:'));
  check(foreign.length === 0, `requests to other origins: ${JSON.stringify(foreign)}`);
  const apiCalls = requests.filter((r) => new URL(r.url).pathname.startsWith('/admin/v1/'));
  check(apiCalls.every((r) => r.auth && r.auth.startsWith('Bearer mpga_')), 'an admin call without the token');
  const changes = apiCalls.filter((r) => r.method !== 'GET');
  const kinds = new Set(changes.map((r) => r.method));
  check(['POST', 'PUT', 'DELETE'].every((m) => kinds.has(m)), `the page made only ${[...kinds]} calls`);
  // Every call the page made, for tests/console.rs to send again without the token.
  const calls = [...new Map(apiCalls.map((r) => {
    const u = new URL(r.url);
    return [`${r.method} ${u.pathname}${u.search}`, { method: r.method, path: u.pathname + u.search }];
  })).values()];
  writeFileSync(join(SHOTS, 'calls.json'), JSON.stringify(calls, null, 1));

  step = 'no errors and no CSP violations';
  check(problems.length === 0, problems.join('\n'));
  log(`all steps held (${apiCalls.length} admin calls, ${calls.length} distinct)`);
  await browser.close();
} catch (e) {
  console.error(`[console] FAILED at "${step}": ${e.message}`);
  if (problems.length) console.error(`[console] page problems:\n${problems.join('\n')}`);
  try {
    await page.screenshot({ path: join(SHOTS, 'failure.png'), fullPage: true });
    console.error(`[console] the page as it was: ${join(SHOTS, 'failure.png')}`);
  } catch {
    // the browser is gone
  }
  await browser.close().catch(() => {});
  process.exit(1);
}
