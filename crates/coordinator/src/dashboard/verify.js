// Receipts checked in the browser, trusting nothing the server says about them: the bytes
// tenet_proto::receipt signs are rebuilt here from the receipt's fields, the coordinator's and
// every node's Ed25519 signature checked with WebCrypto, and the hashes that bind outputs,
// commitments and a dispute's transcript recomputed with BLAKE3 (written out below from the
// BLAKE3 specification; hashes only, no keyed modes). Loaded by the dashboard page and, in
// tests, by node.js against receipts the Rust code signed.
"use strict";

const TenetVerify = (() => {
  // ---------------------------------------------------------------- BLAKE3 (hash mode only)
  const IV = new Uint32Array([
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
  ]);
  const PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
  const CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8;
  const CHUNK = 1024, BLOCK = 64;

  const rotr = (x, n) => (x >>> n) | (x << (32 - n));

  function g(s, a, b, c, d, x, y) {
    s[a] = (s[a] + s[b] + x) | 0;
    s[d] = rotr(s[d] ^ s[a], 16);
    s[c] = (s[c] + s[d]) | 0;
    s[b] = rotr(s[b] ^ s[c], 12);
    s[a] = (s[a] + s[b] + y) | 0;
    s[d] = rotr(s[d] ^ s[a], 8);
    s[c] = (s[c] + s[d]) | 0;
    s[b] = rotr(s[b] ^ s[c], 7);
  }

  // The 16-word state after compressing one block into the chaining value `cv`.
  function compress(cv, m, counter, len, flags) {
    const s = new Int32Array(16);
    for (let i = 0; i < 8; i++) s[i] = cv[i];
    for (let i = 0; i < 4; i++) s[8 + i] = IV[i];
    s[12] = counter % 0x100000000;
    s[13] = Math.floor(counter / 0x100000000);
    s[14] = len;
    s[15] = flags;
    let w = Int32Array.from(m);
    for (let r = 0; r < 7; r++) {
      g(s, 0, 4, 8, 12, w[0], w[1]);
      g(s, 1, 5, 9, 13, w[2], w[3]);
      g(s, 2, 6, 10, 14, w[4], w[5]);
      g(s, 3, 7, 11, 15, w[6], w[7]);
      g(s, 0, 5, 10, 15, w[8], w[9]);
      g(s, 1, 6, 11, 12, w[10], w[11]);
      g(s, 2, 7, 8, 13, w[12], w[13]);
      g(s, 3, 4, 9, 14, w[14], w[15]);
      if (r < 6) w = Int32Array.from(PERM, (p) => w[p]);
    }
    for (let i = 0; i < 8; i++) {
      s[i] ^= s[i + 8];
      s[i + 8] ^= cv[i];
    }
    return s;
  }

  function words(bytes, at, len) {
    const m = new Int32Array(16);
    for (let i = 0; i < len; i++) m[i >> 2] |= bytes[at + i] << (8 * (i & 3));
    return m;
  }

  // A chunk's output: what is left to compress for its last block (the chunk's chaining value,
  // or with ROOT the hash).
  function chunkOutput(bytes, start, end, counter) {
    let cv = IV;
    let at = start;
    let flags = CHUNK_START;
    while (end - at > BLOCK) {
      cv = compress(cv, words(bytes, at, BLOCK), counter, BLOCK, flags).subarray(0, 8);
      flags = 0;
      at += BLOCK;
    }
    return { cv, m: words(bytes, at, end - at), counter, len: end - at, flags: flags | CHUNK_END };
  }

  const cvOf = (o) => compress(o.cv, o.m, o.counter, o.len, o.flags).subarray(0, 8);
  const parentOutput = (left, right) => {
    const m = new Int32Array(16);
    m.set(left, 0);
    m.set(right, 8);
    return { cv: IV, m, counter: 0, len: BLOCK, flags: PARENT };
  };

  function blake3(bytes) {
    const chunks = Math.max(1, Math.ceil(bytes.length / CHUNK));
    const stack = [];
    for (let c = 0; c < chunks - 1; c++) {
      let cv = cvOf(chunkOutput(bytes, c * CHUNK, (c + 1) * CHUNK, c));
      // Merge finished subtrees: as many as the chunk count has trailing zeros.
      let total = c + 1;
      while ((total & 1) === 0) {
        cv = cvOf(parentOutput(stack.pop(), cv));
        total >>= 1;
      }
      stack.push(cv);
    }
    let out = chunkOutput(bytes, (chunks - 1) * CHUNK, bytes.length, chunks - 1);
    while (stack.length) out = parentOutput(stack.pop(), cvOf(out));
    const s = compress(out.cv, out.m, out.counter, out.len, out.flags | ROOT);
    const h = new Uint8Array(32);
    for (let i = 0; i < 32; i++) h[i] = (s[i >> 2] >>> (8 * (i & 3))) & 0xff;
    return h;
  }

  // ------------------------------------------------------------------------- bytes
  const utf8 = (s) => new TextEncoder().encode(s);
  function hex(s) {
    if (typeof s !== "string" || s.length % 2 || /[^0-9a-f]/i.test(s)) throw new Error(`not hex: ${s}`);
    const b = new Uint8Array(s.length / 2);
    for (let i = 0; i < b.length; i++) b[i] = parseInt(s.substr(2 * i, 2), 16);
    return b;
  }
  const toHex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

  class Out {
    constructor() { this.parts = []; this.n = 0; }
    raw(b) { this.parts.push(b); this.n += b.length; return this; }
    u32(v) { const b = new Uint8Array(4); new DataView(b.buffer).setUint32(0, Number(v), true); return this.raw(b); }
    u64(v) { const b = new Uint8Array(8); new DataView(b.buffer).setBigUint64(0, BigInt(v), true); return this.raw(b); }
    f64(v) { const b = new Uint8Array(8); new DataView(b.buffer).setFloat64(0, Number(v), true); return this.raw(b); }
    put(b) { return this.u64(b.length).raw(b); }
    bytes() { const o = new Uint8Array(this.n); let at = 0; for (const p of this.parts) { o.set(p, at); at += p.length; } return o; }
  }

  // BTreeMap<String, _> order: by the names' UTF-8 bytes.
  function byteOrder(a, b) {
    const x = utf8(a), y = utf8(b);
    for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
    return x.length - y.length;
  }

  // ------------------------------------------------------------------------- statements
  function commitmentStatement(job, node, commitment) {
    const o = new Out().raw(utf8("tenet-commitment-v1"));
    o.put(utf8(job.job_id)).put(hex(node)).put(hex(job.task));
    o.put(job.weights ? hex(job.weights) : new Uint8Array(0));
    const names = Object.keys(job.inputs || {}).sort(byteOrder);
    o.u64(names.length);
    for (const n of names) o.put(utf8(n)).put(hex(job.inputs[n]));
    o.put(utf8(job.tier || "exact")).u64(BigInt(job.seed || 0)).put(hex(commitment));
    return o.bytes();
  }

  // A dispute's transcript as serde_json writes it (struct fields in declaration order).
  function transcriptJson(d) {
    const h = JSON.stringify;
    const round = (r) => `{"depth":${r.depth},"index":${r.index},"answers":[[${h(r.answers[0][0])},${h(r.answers[0][1])}],[${h(r.answers[1][0])},${h(r.answers[1][1])}]]}`;
    const proof = (p) => `{"index":${p.index},"leaf":${h(p.leaf)},"siblings":[${p.siblings.map((x) => h(x)).join(",")}]}`;
    let s = `{"count":${d.count},"roots":[${h(d.roots[0])},${h(d.roots[1])}],"rounds":[${d.rounds.map(round).join(",")}]`;
    s += `,"leaf":${d.leaf === null || d.leaf === undefined ? "null" : d.leaf}`;
    s += `,"operands":[${d.operands.map(proof).join(",")}],"operands_from":${d.operands_from || 0}`;
    s += `,"bad_operands":[${(d.bad_operands || []).join(",")}]`;
    s += `,"referee":${d.referee ? h(d.referee) : "null"},"verdict":{"Lost":[${d.verdict.Lost.join(",")}]}`;
    if (d.stalled !== null && d.stalled !== undefined) s += `,"stalled":${d.stalled}`;
    if (d.committed) s += `,"committed":[${d.committed.map((c) => `[${c.map((x) => h(x)).join(",")}]`).join(",")}]`;
    if (d.outputs && d.outputs.length) s += `,"outputs":[${d.outputs.map(proof).join(",")}]`;
    return s + "}";
  }

  function receiptStatement(r) {
    const o = new Out().raw(utf8("tenet-receipt-v1")).u32(r.version);
    o.put(commitmentStatement(r.job, r.coordinator, r.output_hash));
    o.u64(r.outputs.length);
    for (const x of r.outputs) o.put(utf8(x.name)).put(hex(x.hash)).put(utf8(x.type));
    o.u32(r.replicas).f64(r.tolerance).u64(r.nodes.length);
    for (const n of r.nodes) {
      const c = n.commitment;
      o.put(commitmentStatement(c, c.node, c.commitment)).put(hex(c.signature));
      o.put(hex(n.output_hash)).put(hex(n.salt));
    }
    o.put(hex(r.coordinator)).u64(r.issued_at);
    if (r.dispute) o.put(utf8("dispute")).put(blake3(utf8(transcriptJson(r.dispute))));
    return o.bytes();
  }

  function outputHash(outputs) {
    const o = new Out().raw(utf8("tenet-outputs-v1"));
    for (const x of outputs) o.u64(utf8(x.name).length).raw(utf8(x.name)).raw(hex(x.hash));
    return toHex(blake3(o.bytes()));
  }

  const commitmentDigest = (outputHash, salt) =>
    toHex(blake3(new Out().raw(utf8("tenet-commit-v1")).raw(hex(outputHash)).raw(hex(salt)).bytes()));

  async function ed25519(pub, sig, msg) {
    const key = await crypto.subtle.importKey("raw", hex(pub), { name: "Ed25519" }, false, ["verify"]);
    return crypto.subtle.verify({ name: "Ed25519" }, key, hex(sig), msg);
  }

  // Seeds are u64: keep them exact by reading them as strings before JSON.parse sees them.
  const parse = (text) => JSON.parse(text.replace(/"seed":(\d+)/g, '"seed":"$1"'));

  const JOB_FIELDS = ["job_id", "task", "weights", "tier", "seed"];
  function sameJob(a, b) {
    for (const f of JOB_FIELDS) if (String(a[f] ?? "") !== String(b[f] ?? "")) return false;
    const ka = Object.keys(a.inputs || {}).sort(), kb = Object.keys(b.inputs || {}).sort();
    return ka.length === kb.length && ka.every((k, i) => k === kb[i] && a.inputs[k] === b.inputs[k]);
  }

  // Every check the receipt allows without the tensors: the list of checks made, and whether
  // all passed. `coordinator` (hex), when given, is the key the receipt must be signed by.
  async function verifyReceipt(r, coordinator) {
    const checks = [];
    const check = (what, ok) => { checks.push({ what, ok: !!ok }); return !!ok; };
    try {
      check("receipt version 1", r.version === 1);
      if (coordinator) check(`signed by the coordinator ${coordinator.slice(0, 12)}`, r.coordinator === coordinator);
      check("the coordinator's Ed25519 signature over the receipt", await ed25519(r.coordinator, r.signature, receiptStatement(r)));
      check("the output hash binds the listed outputs (BLAKE3)", outputHash(r.outputs) === r.output_hash);
      const seen = new Set();
      for (const n of r.nodes) {
        const c = n.commitment, who = c.node.slice(0, 12);
        check(`node ${who} listed once`, !seen.has(c.node));
        seen.add(c.node);
        check(`node ${who}: its Ed25519 signature over its commitment`, await ed25519(c.node, c.signature, commitmentStatement(c, c.node, c.commitment)));
        check(`node ${who}: committed to this job`, sameJob(c, r.job));
        check(`node ${who}: its reveal opens its commitment (BLAKE3)`, commitmentDigest(n.output_hash, n.salt) === c.commitment);
        if ((r.job.tier || "exact") === "exact") check(`node ${who}: revealed the agreed output`, n.output_hash === r.output_hash);
      }
      if (r.dispute) {
        const lost = r.dispute.verdict && r.dispute.verdict.Lost;
        check("decided by a dispute with one loser (its transcript bound by the signature)", Array.isArray(lost) && lost.length === 1 && r.nodes.length > 0);
        if (r.dispute.committed && Array.isArray(lost) && lost.length === 1) {
          const won = r.dispute.committed[1 - lost[0]] || [];
          check("the dispute's winner committed to the receipt's outputs", won.length === r.outputs.length && won.every((x, i) => x === r.outputs[i].hash));
        }
      } else {
        check(`a majority agreed (${r.nodes.length} of ${r.replicas})`, r.nodes.length * 2 > r.replicas);
      }
    } catch (e) {
      check(`readable: ${e.message}`, false);
    }
    return { ok: checks.length > 0 && checks.every((c) => c.ok), checks };
  }

  return { blake3, toHex, utf8, parse, receiptStatement, transcriptJson, verifyReceipt };
})();

if (typeof module !== "undefined") module.exports = TenetVerify;
