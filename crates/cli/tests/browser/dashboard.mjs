// Drives a real headless Chromium through the DevTools protocol (over --remote-debugging-pipe:
// no port, no extra package) against a running `tenet demo --dashboard`, and checks what a
// person would look for: the five nodes, a job appearing live, the liar marked slashed, a
// receipt verified in the page (and a tampered one refused). Screenshots go to --out.
//
// node dashboard.mjs --chromium PATH --url URL --cheater HEX --out DIR
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
for (const k of ["chromium", "url", "cheater", "out"]) if (!args[k]) throw new Error(`--${k} is required`);

const profile = mkdtempSync(join(tmpdir(), "tenet-chromium-"));
const chrome = spawn(
  args.chromium,
  ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
   "--remote-debugging-pipe", "--window-size=1440,1500", `--user-data-dir=${profile}`, "about:blank"],
  { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"] },
);
let stderr = "";
chrome.stderr.on("data", (d) => { stderr += d; });

let nextId = 1;
const waiting = new Map();
let buf = "";
chrome.stdio[4].on("data", (d) => {
  buf += d.toString("utf8");
  let at;
  while ((at = buf.indexOf("\0")) >= 0) {
    const msg = JSON.parse(buf.slice(0, at));
    buf = buf.slice(at + 1);
    if (msg.id && waiting.has(msg.id)) {
      const { resolve, reject } = waiting.get(msg.id);
      waiting.delete(msg.id);
      if (msg.error) reject(new Error(`${msg.error.message} ${msg.error.data || ""}`));
      else resolve(msg.result);
    }
  }
});

function send(method, params = {}, sessionId) {
  const id = nextId++;
  const msg = { id, method, params };
  if (sessionId) msg.sessionId = sessionId;
  chrome.stdio[3].write(JSON.stringify(msg) + "\0");
  return new Promise((resolve, reject) => waiting.set(id, { resolve, reject }));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let session;
async function evaluate(expression) {
  const r = await send("Runtime.evaluate", { expression, returnByValue: true, awaitPromise: true }, session);
  if (r.exceptionDetails) throw new Error(`${expression}: ${JSON.stringify(r.exceptionDetails).slice(0, 400)}`);
  return r.result.value;
}
async function waitFor(what, expression, ms = 20000) {
  const until = Date.now() + ms;
  let last;
  while (Date.now() < until) {
    try { last = await evaluate(expression); if (last) return last; } catch (e) { last = e.message; }
    await sleep(250);
  }
  throw new Error(`timed out waiting for ${what} (last: ${JSON.stringify(last)})`);
}
async function screenshot(name) {
  const r = await send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true }, session);
  const path = join(args.out, name);
  writeFileSync(path, Buffer.from(r.data, "base64"));
  return path;
}

const report = { shots: [] };
try {
  const { targetInfos } = await send("Target.getTargets");
  let page = targetInfos.find((t) => t.type === "page");
  const targetId = page ? page.targetId : (await send("Target.createTarget", { url: "about:blank" })).targetId;
  session = (await send("Target.attachToTarget", { targetId, flatten: true })).sessionId;
  await send("Page.enable", {}, session);
  await send("Runtime.enable", {}, session);
  await send("Page.navigate", { url: args.url }, session);

  // The nodes, from the API.
  report.nodes = await waitFor("five node rows", "document.querySelectorAll('#nodes tbody tr').length === 5 && 5");
  // The liar, marked slashed in its row.
  await waitFor("the liar marked slashed",
    `(() => { const r = document.querySelector('#nodes tr[data-node="${args.cheater}"]');
              return r && r.classList.contains('slashed') && r.textContent.includes('slashed'); })()`);
  report.liar_marked = true;
  // A job appearing live: a row that was not there when we looked, decided without a reload.
  await waitFor("the event stream", "document.getElementById('conn').textContent === 'live'");
  await evaluate("window.__seen = new Set([...document.querySelectorAll('#jobs tbody tr')].map(r => r.dataset.job)); true");
  report.live_job = await waitFor("a new job decided live",
    `(() => { const r = [...document.querySelectorAll('#jobs tbody tr')].find(r => !window.__seen.has(r.dataset.job) && r.textContent.includes('decided'));
              return r && r.dataset.job; })()`, 30000);
  report.slash_listed = await evaluate(`document.querySelectorAll('#slashes li[data-slash="${args.cheater}"]').length`);
  report.shots.push(await screenshot("dashboard.png"));

  // A receipt verified in the page: a job the liar lost, decided by a dispute when there is one.
  const job = await waitFor("a job with a dispute or a slash",
    `(() => { const rows = [...document.querySelectorAll('#jobs tbody tr')].filter(r => r.textContent.includes('decided'));
              const r = rows.find(r => r.textContent.includes('dispute')) || rows.find(r => r.textContent.includes('slashed')) || rows[0];
              return r && r.dataset.job; })()`);
  await evaluate(`document.querySelector('#jobs tr[data-job="${job}"]').click(); true`);
  await waitFor("the receipt panel", "!document.getElementById('receiptPanel').hidden && !document.getElementById('verify').disabled && !!window.tenetCurrent");
  await evaluate("document.getElementById('verify').click(); true");
  report.verdict = await waitFor("the verdict",
    "(() => { const t = document.getElementById('verdict').textContent; return t !== 'not checked' && t; })()");
  report.checks = await evaluate("[...document.querySelectorAll('#checks li')].map(l => (l.className === 'ok' ? '+ ' : '- ') + l.textContent)");
  report.receipt_job = job;
  report.disputed = await evaluate("!!(window.tenetCurrent && window.tenetCurrent.dispute)");
  // The same check refuses a receipt altered in any signed field.
  report.tampered = await evaluate(`(async () => {
      const r = JSON.parse(JSON.stringify(window.tenetCurrent));
      const a = { ...r, issued_at: r.issued_at + 1 };
      const b = JSON.parse(JSON.stringify(r)); b.outputs[0].name += 'x';
      const c = JSON.parse(JSON.stringify(r)); c.nodes[0].salt = c.nodes[0].salt.replace(/^./, (x) => x === '0' ? '1' : '0');
      return [(await TenetVerify.verifyReceipt(a)).ok, (await TenetVerify.verifyReceipt(b)).ok, (await TenetVerify.verifyReceipt(c)).ok];
    })()`);
  // What the download link hands over (the blob it points at is made of this text): the
  // receipt file `tenet receipt verify` reads.
  report.download = await evaluate("window.tenetDownload");
  await evaluate("document.getElementById('receiptPanel').scrollIntoView(); true");
  report.shots.push(await screenshot("receipt.png"));
  // A node's own, smaller page: its id, and the jobs it committed.
  if (args["node-url"]) {
    await send("Page.navigate", { url: args["node-url"] }, session);
    report.node_page = await waitFor("the node's page",
      `(() => { const id = document.getElementById('nodeId'); const jobs = Number(document.getElementById('cJobs').textContent);
                return id && id.title === '${args["node-id"]}' && jobs > 0 && document.getElementById('conn').textContent === 'live' && jobs; })()`);
    report.shots.push(await screenshot("node.png"));
  }
  console.log(JSON.stringify(report));
} catch (e) {
  console.error(`dashboard check failed: ${e.message}\n--- chromium stderr (tail) ---\n${stderr.slice(-2000)}`);
  process.exitCode = 1;
} finally {
  try { await Promise.race([send("Browser.close"), sleep(3000)]); } catch { /* already gone */ }
  // Wait for Chromium to be gone before removing its profile: its helper processes may still
  // be writing there for a moment after the kill (seen as ENOTEMPTY), so retry a few times and
  // never let the cleanup decide the test.
  const exited = new Promise((resolve) => chrome.once("exit", resolve));
  chrome.kill("SIGKILL");
  await Promise.race([exited, sleep(3000)]);
  try {
    rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
  } catch (e) {
    console.error(`could not remove the browser profile ${profile}: ${e.message}`);
  }
}
