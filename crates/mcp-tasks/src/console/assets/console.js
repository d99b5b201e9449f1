/*
 * mcp-tasks operator console — the script of every page.
 *
 * Served embedded in the binary (include_bytes!) at ROOT/assets/console.js and written by hand:
 * plain ES2020, no framework, no build step, no third-party code. Edit it and `cargo build`.
 *
 * The server sends the same shell (console.html) for every page; this script reads
 * location.pathname relative to the console's root (<meta name="console-root">) and renders
 * the overview, the task list, a task's page, the not-found page, or the login form when the
 * API answers 401. Data comes from the JSON API (ROOT/api/…) and live updates from the
 * server-sent events of ROOT/api/events (docs/CONSOLE.md).
 *
 * Rules it keeps (Content-Security-Policy, safety): DOM built with createElement/textContent
 * only — never innerHTML — since tool names, messages and arguments come from clients; no
 * inline styles or handlers; no eval; no request to any other host; window.confirm is never
 * used (actions confirm in the page). Every URL is built from ROOT, so the console works
 * nested under any prefix. Element ids the browser tests rely on are listed in the contract.
 */
'use strict';

(function () {
  // ---- Basics: DOM building, formatting.

  const $ = (sel, root = document) => root.querySelector(sel);
  const meta = (name) => { const m = $(`meta[name="${name}"]`); return m ? m.content : ''; };

  let ROOT = meta('console-root');
  if (!ROOT || ROOT.includes('{{')) ROOT = '/';
  if (!ROOT.endsWith('/')) ROOT += '/';
  const SHELL_STATUS = meta('console-status');
  const STATUSES = ['working', 'input_required', 'completed', 'failed', 'cancelled'];
  const LABELS = { working: 'Working', input_required: 'Input required', completed: 'Completed', failed: 'Failed', cancelled: 'Cancelled' };
  const FILTERS = ['status', 'tool', 'owner', 'from', 'to', 'q'];
  const FOLD_OPEN_BELOW = 2048; // bytes: JSON smaller than this is shown unfolded
  const SVGNS = 'http://www.w3.org/2000/svg';

  /** Appends children (nodes, or strings as text nodes; null/false skipped). */
  function add(el, kids) {
    for (const k of kids.flat(Infinity)) {
      if (k == null || k === false) continue;
      el.append(k instanceof Node ? k : String(k));
    }
    return el;
  }

  /** h('tag', {class, text, onclick, attr…}, ...children): an element. Text only as text. */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    return add(el, kids);
  }

  /** The same for SVG elements. */
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null) continue;
      if (k === 'text') el.textContent = v;
      else el.setAttribute(k, String(v));
    }
    return add(el, kids);
  }

  const fmtNum = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '—');
  const fmtOwner = (o) => (!o ? '—' : o.tenant ? `${o.tenant}/${o.principal}` : o.principal);
  const plural = (n, one, many) => `${fmtNum(n)} ${n === 1 ? one : many || one + 's'}`;

  function fmtBytes(n) {
    if (typeof n !== 'number') return '—';
    const units = ['B', 'KB', 'MB', 'GB', 'TB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
  }

  function fmtDuration(ms) {
    if (typeof ms !== 'number') return '—';
    if (ms < 1000) return `${ms} ms`;
    const sec = Math.round(ms / 1000);
    if (sec < 120) return `${sec} s`;
    if (sec < 7200) return `${Math.round(sec / 60)} min`;
    if (sec < 172800) return `${Math.round(sec / 3600)} h`;
    return `${Math.round(sec / 86400)} d`;
  }

  // Ages are computed against the server's clock (overview.now) to survive a skewed browser.
  let skew = 0;
  const now = () => Date.now() + skew;
  const utc = (ms) => new Date(ms).toISOString().replace('T', ' ').replace(/(\.\d+)?Z$/, ' UTC');

  function ago(ms) {
    const d = now() - ms;
    const a = Math.abs(d);
    if (a < 5000) return 'just now';
    let t;
    if (a < 60e3) t = `${Math.floor(a / 1e3)} s`;
    else if (a < 3600e3) t = `${Math.floor(a / 60e3)} min`;
    else if (a < 86400e3) t = `${Math.floor(a / 3600e3)} h`;
    else t = `${Math.floor(a / 86400e3)} d`;
    return d < 0 ? `in ${t}` : `${t} ago`;
  }

  /** A relative time ("3 min ago") with the absolute UTC time as its title; kept current. */
  function timeEl(ms) {
    if (typeof ms !== 'number') return h('span', { class: 'muted', text: '—' });
    return h('time', { datetime: new Date(ms).toISOString(), title: utc(ms), 'data-ts': ms, text: ago(ms) });
  }
  setInterval(() => {
    for (const el of document.querySelectorAll('[data-ts]')) el.textContent = ago(Number(el.dataset.ts));
  }, 10000);

  function badge(status, isError) {
    // A task that completed with a result of isError: true is a tool error: marked as one.
    if (isError && status === 'completed') {
      return h('span', { class: 'badge st-failed tool-error', text: 'completed · tool error', title: 'The tool\'s result has isError: true' });
    }
    return h('span', { class: `badge st-${STATUSES.includes(status) ? status : 'unknown'}`, text: status });
  }

  const taskUrl = (id) => `${ROOT}tasks/${encodeURIComponent(id)}`;
  const listUrl = (params) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) if (v != null && v !== '') q.set(k, v);
    const qs = q.toString();
    return `${ROOT}tasks${qs ? '?' + qs : ''}`;
  };
  const ownerParam = (o) => (o.tenant ? `${o.tenant}/${o.principal}` : o.principal);

  /** Calls `fn` at most once per `gap` ms (trailing), never twice at once. */
  function limiter(fn, gap) {
    let last = 0, timer = null, running = false, again = false;
    const run = async () => {
      timer = null;
      if (running) { again = true; return; }
      running = true;
      last = Date.now();
      try { await fn(); } catch (e) { fail(e); } finally {
        running = false;
        if (again) { again = false; trigger(); }
      }
    };
    const trigger = () => { if (!timer) timer = setTimeout(run, Math.max(0, last + gap - Date.now())); };
    return trigger;
  }

  // ---- JSON, folded: pretty-printed in a <details>, open only when small, with its size.

  const TOKEN = /("(?:[^"\\]|\\.)*")(\s*:)?|\b(?:true|false|null)\b|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;

  /** Pretty JSON text as nodes with token classes (spans with textContent: safe). */
  function highlight(text) {
    const frag = document.createDocumentFragment();
    if (text.length > 200000) { frag.append(text); return frag; }
    let last = 0, m;
    TOKEN.lastIndex = 0;
    while ((m = TOKEN.exec(text))) {
      if (m.index > last) frag.append(text.slice(last, m.index));
      if (m[1]) {
        frag.append(h('span', { class: m[2] ? 'j-key' : 'j-str', text: m[1] }));
        if (m[2]) frag.append(m[2]);
      } else {
        frag.append(h('span', { class: /^[tfn]/.test(m[0]) ? 'j-lit' : 'j-num', text: m[0] }));
      }
      last = TOKEN.lastIndex;
    }
    frag.append(text.slice(last));
    return frag;
  }

  function shape(v) {
    if (Array.isArray(v)) return `array · ${plural(v.length, 'item')}`;
    if (v && typeof v === 'object') return `object · ${plural(Object.keys(v).length, 'key')}`;
    return v === null ? 'null' : typeof v;
  }

  function fold(value, key, label) {
    const text = JSON.stringify(value === undefined ? null : value, null, 2);
    const bytes = new TextEncoder().encode(text).length;
    const pre = h('pre', { class: 'code' });
    const d = h('details', { class: 'json', 'data-fold': key },
      h('summary', null, h('span', { class: 'fold-label', text: label || shape(value) }),
        h('span', { class: 'fold-size', text: fmtBytes(bytes) })),
      pre);
    const fill = () => { if (!pre.firstChild) pre.append(highlight(text)); };
    if (bytes < FOLD_OPEN_BELOW) { d.open = true; fill(); } else d.addEventListener('toggle', fill);
    return d;
  }

  /** Keeps the user's open/closed choices of folded JSON across a re-render of `root`. */
  function keepFolds(root, render) {
    const open = new Map();
    for (const d of root.querySelectorAll('details[data-fold]')) open.set(d.dataset.fold, d.open);
    render();
    for (const d of root.querySelectorAll('details[data-fold]')) {
      if (open.has(d.dataset.fold) && open.get(d.dataset.fold) !== d.open) d.open = open.get(d.dataset.fold);
    }
  }

  // ---- The API.

  const state = { csrf: '', actions: false, overview: null, page: null };

  class ApiError extends Error {
    constructor(message, status, login) { super(message); this.status = status; this.login = login; }
  }

  async function api(path, { method = 'GET', body } = {}) {
    const opts = { method, headers: { Accept: 'application/json' }, credentials: 'same-origin', cache: 'no-store' };
    if (method !== 'GET') {
      opts.headers['Content-Type'] = 'application/json';
      if (state.csrf) opts.headers['X-Console-Csrf'] = state.csrf;
      opts.body = JSON.stringify(body || {});
    }
    let res;
    try { res = await fetch(ROOT + path, opts); } catch (e) {
      throw new ApiError(`Could not reach the server (${e.message})`, 0, false);
    }
    const text = res.status === 204 ? '' : await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) {
        if (res.ok) throw new ApiError(`${path}: the server's answer is not JSON`, res.status, false);
      }
    }
    if (!res.ok) {
      const msg = data && typeof data.error === 'string' ? data.error : `${path}: ${res.status} ${res.statusText}`;
      throw new ApiError(msg, res.status, res.status === 401);
    }
    return data;
  }

  async function loadOverview() {
    const o = await api('api/overview');
    state.overview = o;
    state.csrf = o.csrf || '';
    state.actions = !!o.actions;
    if (typeof o.now === 'number') skew = o.now - Date.now();
    setViewer(o.viewer);
    return o;
  }

  // ---- Page frame: title, nav, header, banner, readiness.

  const main = () => $('#main');
  function clearMain() { const m = main(); m.textContent = ''; return m; }
  function setTitle(t) { document.title = `${t} — mcp-tasks console`; }
  function setNav(which) {
    for (const id of ['overview', 'tasks']) {
      const a = $(`#nav-${id}`);
      if (!a) continue;
      if (id === which) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
  }
  function markReady() { document.body.dataset.ready = '1'; }

  function setViewer(v) {
    const el = $('#viewer');
    el.textContent = '';
    if (v) {
      add(el, [h('span', { class: 'viewer-name', title: 'Signed in as', text: fmtOwner(v) }),
        v.admin ? h('span', { class: 'tag', text: 'admin' }) : null]);
    } else {
      el.append(h('span', { class: 'muted', title: 'This console has no authentication', text: 'no authentication' }));
    }
    $('#sign-out').hidden = !v;
  }

  function showBanner(message) {
    const b = $('#banner');
    b.textContent = '';
    add(b, [h('span', { class: 'banner-text', text: message }),
      h('button', { class: 'btn btn-small', type: 'button', text: 'Reload', onclick: () => location.reload() }),
      h('button', { class: 'btn btn-small btn-ghost', type: 'button', text: 'Dismiss', onclick: () => { b.hidden = true; } })]);
    b.hidden = false;
  }

  /** Shows an error: the login form for a 401, else a banner. Never a blank page. */
  function fail(e) {
    if (e && e.login) { renderLogin(e.message); return; }
    showBanner(e && e.message ? e.message : String(e));
    const m = main();
    const loading = $('.loading', m);
    if (loading) loading.textContent = 'This page could not be loaded.';
  }

  function setResult(el, text, kind) {
    if (!el) return;
    el.textContent = text;
    el.className = `action-result ${kind || ''}`;
    el.hidden = !text;
  }

  // ---- The in-page confirmation (never window.confirm).

  function closeConfirm() { const b = $('#confirm-box'); if (b) b.remove(); }

  function askConfirm(after, message, onYes) {
    closeConfirm();
    const yes = h('button', { id: 'confirm-yes', class: 'btn btn-danger', type: 'button', text: 'Confirm' });
    const no = h('button', { id: 'confirm-no', class: 'btn', type: 'button', text: 'Back' });
    const box = h('div', { id: 'confirm-box', class: 'confirm', role: 'alertdialog', 'aria-labelledby': 'confirm-text' },
      h('p', { id: 'confirm-text', text: message }), h('div', { class: 'confirm-buttons' }, yes, no));
    no.addEventListener('click', closeConfirm);
    box.addEventListener('keydown', (e) => { if (e.key === 'Escape') closeConfirm(); });
    yes.addEventListener('click', () => { closeConfirm(); onYes(); });
    after.after(box);
    no.focus();
  }

  // ---- Live updates: one EventSource per page; the page's handlers apply the events.

  const live = { es: null, retries: 0, timer: null, wasDown: false };

  function setLive(st, text) {
    const el = $('#live');
    el.dataset.state = st;
    el.textContent = text;
  }

  function startLive() {
    if (live.es) return;
    if (!window.EventSource) { setLive('off', 'no live updates'); return; }
    setLive('connecting', 'connecting…');
    const es = new EventSource(ROOT + 'api/events');
    live.es = es;
    es.onopen = () => {
      live.retries = 0;
      setLive('on', 'live');
      if (live.wasDown) { live.wasDown = false; resync(); } // events may have been missed
    };
    es.onerror = () => {
      live.wasDown = true;
      setLive('down', 'reconnecting…');
      if (es.readyState === EventSource.CLOSED) { // the browser gave up: retry ourselves
        live.es = null;
        clearTimeout(live.timer);
        live.timer = setTimeout(startLive, Math.min(30000, 1000 * 2 ** live.retries++));
      }
    };
    es.addEventListener('task', (ev) => {
      let row;
      try { row = JSON.parse(ev.data); } catch (e) { return; }
      if (row && state.page && state.page.onTask) state.page.onTask(row);
    });
    es.addEventListener('resync', resync);
  }

  function stopLive() {
    clearTimeout(live.timer);
    if (live.es) { live.es.close(); live.es = null; }
  }

  function resync() { if (state.page && state.page.resync) state.page.resync(); }

  // ---- Overview.

  async function pageOverview() {
    setTitle('Overview');
    setNav('overview');
    const o = await loadOverview();
    const m = clearMain();
    const stats = h('section', { class: 'stats', 'aria-label': 'Tasks by status' });
    const chartBody = h('div', { class: 'card-body' });
    const storeBody = h('div', { class: 'card-body' });
    const runtimeBody = h('div', { class: 'card-body' });
    const toolsBody = h('div', { class: 'card-body flush' });
    let grid;
    const nodesCard = h('section', { class: 'card', hidden: true },
      h('h2', { text: 'Replicas' }), h('div', { class: 'card-body flush' }));
    add(m, [
      h('div', { class: 'page-head' }, h('h1', { text: 'Overview' })),
      stats,
      grid = h('div', { class: 'grid-main' },
        h('section', { class: 'card chart-card' }, h('h2', { text: 'Throughput, last hour' }), chartBody),
        h('div', { class: 'stack' },
          h('section', { class: 'card' }, h('h2', { text: 'Store' }), storeBody),
          h('section', { class: 'card' }, h('h2', { text: 'This server' }), runtimeBody))),
      h('section', { class: 'card' }, h('h2', { text: 'Tools' }), toolsBody),
      nodesCard,
    ]);
    if (o.actions && (!o.viewer || o.viewer.admin)) m.append(purgeCard());

    const fill = (o) => {
      stats.replaceChildren(...STATUSES.map((st) => h('a', { class: `stat st-${st}`, href: listUrl({ status: st }) },
        h('span', { class: 'stat-n', id: `count-${st}`, text: String(o.statuses[st] ?? 0) }),
        h('span', { class: 'stat-label', text: LABELS[st] }))));
      // Throughput is cluster-wide: admins only (null otherwise).
      grid.classList.toggle('no-chart', !Array.isArray(o.throughput));
      chartBody.replaceChildren(Array.isArray(o.throughput) ? chart(o.throughput) : '');
      storeBody.replaceChildren(storeInfo(o.store || {}));
      runtimeBody.replaceChildren(runtimeInfo(o));
      toolsBody.replaceChildren(toolsTable(o.tools || []));
      nodesCard.hidden = !Array.isArray(o.nodes);
      nodesCard.lastChild.replaceChildren(Array.isArray(o.nodes) ? nodesTable(o.nodes) : '');
    };
    fill(o);
    const refresh = limiter(async () => fill(await loadOverview()), 1000);
    state.page = { onTask: refresh, resync: refresh };
  }

  function dl(rows) {
    const el = h('dl', { class: 'facts' });
    for (const [label, value, id] of rows) {
      if (value === undefined) continue;
      el.append(h('dt', { text: label }), h('dd', { id }, value));
    }
    return el;
  }

  function storeInfo(st) {
    const el = dl([
      ['Backend', st.kind || '—'],
      ['Location', st.location ? h('code', { text: st.location }) : undefined],
      ['Size', fmtBytes(st.bytes)],
      ['Tasks', fmtNum(st.tasks)],
      ['Live tasks', fmtNum(st.live)],
    ]);
    el.id = 'store-info';
    return el;
  }

  function runtimeInfo(o) {
    const r = o.recovery;
    let rec;
    if (r) {
      rec = h('span', null, `${plural(r.rehydrated, 'task')} rehydrated in ${fmtDuration(r.tookMs)}, `, timeEl(r.startedAt));
    } else rec = h('span', { class: 'muted', text: 'no recovery recorded' });
    return dl([
      ['Live actors', h('span', { class: 'big-n', text: o.liveActors == null ? '—' : String(o.liveActors) }), 'live-actors'],
      ['Parked (waiting for input, no actor)', h('span', { class: 'big-n', text: o.parkedTasks == null ? '—' : String(o.parkedTasks) }), 'parked-tasks'],
      ['Recovery at start', rec, 'recovery'],
    ]);
  }

  function table(id, heads, rows, empty) {
    const thead = h('thead', null, h('tr', null, heads.map(([t, cls]) => h('th', { class: cls, text: t }))));
    const tbody = h('tbody', null, rows);
    if (!rows.length) tbody.append(h('tr', { class: 'empty' }, h('td', { colspan: heads.length, text: empty })));
    return h('div', { class: 'table-wrap' }, h('table', { id, class: 'table' }, thead, tbody));
  }

  function toolsTable(tools) {
    const rows = tools.map((t) => {
      const total = STATUSES.reduce((n, st) => n + (t[st] || 0), 0);
      return h('tr', { 'data-tool': t.tool },
        h('td', { class: 'tool' }, h('a', { href: listUrl({ tool: t.tool }), text: t.tool })),
        STATUSES.map((st) => h('td', { class: 'num' }, t[st]
          ? h('a', { class: `count st-${st}`, href: listUrl({ tool: t.tool, status: st }), text: fmtNum(t[st]) })
          : h('span', { class: 'zero', text: '0' }))),
        h('td', { class: 'num total', text: fmtNum(total) }));
    });
    return table('tools-table', [['Tool'], ...STATUSES.map((st) => [st, 'num']), ['total', 'num']], rows, 'No tasks yet.');
  }

  function nodesTable(nodes) {
    const rows = nodes.map((n) => h('tr', { class: now() - n.heartbeatAt > 30000 ? 'stale' : null },
      h('td', { class: 'mono' }, n.node, n.self ? h('span', { class: 'tag', text: 'this replica' }) : null),
      h('td', null, timeEl(n.heartbeatAt)),
      h('td', { class: 'num', text: fmtNum(n.leases) })));
    return table('nodes-table', [['Node'], ['Last heartbeat'], ['Leases', 'num']], rows, 'No replica has a heartbeat.');
  }

  /** The throughput chart: 60 one-minute buckets, four series, axes and a legend, in SVG. */
  function chart(buckets) {
    const W = 640, H = 230, L = 38, R = 10, T = 34, B = 24;
    const series = [['created', 'Created'], ['completed', 'Completed'], ['failed', 'Failed'], ['cancelled', 'Cancelled']];
    const n = buckets.length;
    const max = Math.max(0, ...buckets.map((b) => Math.max(...series.map(([k]) => b[k] || 0))));
    // A "nice" scale: 1, 2 or 5 times a power of ten per step, four steps at most.
    let step = 1;
    if (max > 4) {
      const raw = max / 4, p = 10 ** Math.floor(Math.log10(raw));
      step = [1, 2, 5, 10].map((f) => f * p).find((v) => v >= raw);
    }
    const top = Math.max(step * Math.ceil(max / step), step * 2);
    const pw = W - L - R, ph = H - T - B;
    const x = (i) => L + (n > 1 ? (i * pw) / (n - 1) : pw / 2);
    const y = (v) => T + ph - (v / top) * ph;

    const svg = s('svg', { id: 'throughput-chart', class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': 'Tasks created, completed, failed and cancelled per minute over the last hour' });
    svg.append(s('title', { text: 'Tasks per minute, last hour (UTC minutes)' }));
    const grid = s('g', { class: 'grid' });
    for (let v = 0; v <= top; v += step) {
      grid.append(s('line', { x1: L, x2: W - R, y1: y(v), y2: y(v) }),
        s('text', { class: 'axis', x: L - 6, y: y(v) + 4, 'text-anchor': 'end', text: fmtNum(v) }));
    }
    for (const i of [0, n - 46, n - 31, n - 16, n - 1]) {
      if (i < 0 || i >= n) continue;
      const minsAgo = n - 1 - i;
      grid.append(s('line', { class: 'tick', x1: x(i), x2: x(i), y1: T + ph, y2: T + ph + 4 }),
        s('text', { class: 'axis', x: x(i), y: H - 6, 'text-anchor': i === 0 ? 'start' : i === n - 1 ? 'end' : 'middle',
          text: minsAgo === 0 ? 'now' : `−${minsAgo} min` }));
    }
    svg.append(grid);
    for (const [k] of series) {
      const pts = buckets.map((b, i) => `${x(i).toFixed(1)},${y(b[k] || 0).toFixed(1)}`).join(' ');
      if (k === 'created') {
        svg.append(s('polygon', { class: 'area s-created', points: `${x(0)},${y(0)} ${pts} ${x(n - 1)},${y(0)}` }));
      }
      svg.append(s('polyline', { class: `line s-${k}`, points: pts }));
    }
    // The legend, with each series' total over the hour.
    let lx = L;
    const legend = s('g', { class: 'legend' });
    for (const [k, label] of series) {
      const total = buckets.reduce((a, b) => a + (b[k] || 0), 0);
      const text = `${label} ${fmtNum(total)}`;
      legend.append(s('rect', { class: `swatch s-${k}`, x: lx, y: 8, width: 10, height: 10, rx: 2 }),
        s('text', { class: 'legend-text', x: lx + 15, y: 17, text }));
      lx += 30 + text.length * 6.6;
    }
    svg.append(legend);
    if (max === 0) {
      svg.append(s('text', { class: 'axis empty-note', x: L + pw / 2, y: T + ph / 2, 'text-anchor': 'middle', text: 'No activity in the last hour' }));
    }
    // One transparent column per minute with its figures as a tooltip.
    const hover = s('g', { class: 'hover' });
    buckets.forEach((b, i) => {
      const w = pw / Math.max(1, n - 1);
      const t = `${utc(b.minute).slice(11, 16)} UTC — ${series.map(([k, l]) => `${l.toLowerCase()} ${b[k] || 0}`).join(', ')}`;
      hover.append(s('rect', { x: Math.max(L, x(i) - w / 2), y: T, width: w, height: ph }, s('title', { text: t })));
    });
    svg.append(hover);
    return h('div', { class: 'chart-box' }, svg);
  }

  function purgeCard() {
    const input = h('input', { id: 'purge-before', type: 'date', name: 'before', required: true });
    const button = h('button', { id: 'purge', class: 'btn btn-danger-outline', type: 'submit', text: 'Purge…' });
    const result = h('div', { id: 'action-result', class: 'action-result', role: 'status', hidden: true });
    const form = h('form', { id: 'purge-form', class: 'inline-form' },
      h('label', { for: 'purge-before', text: 'Finished tasks last updated before (UTC)' }), input, button);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const before = input.value;
      if (!before) return;
      askConfirm(form, `Delete every completed, failed and cancelled task last updated before ${before} (UTC)? This cannot be undone.`,
        async () => {
          button.disabled = true;
          let purged = 0;
          try {
            for (;;) {
              setResult(result, `Purging… ${plural(purged, 'task')} deleted so far`, 'progress');
              const r = await api('api/purge', { method: 'POST', body: { before } });
              purged += r.purged || 0;
              if (!r.more) break;
            }
            setResult(result, `Purged ${plural(purged, 'finished task')}.`, 'ok');
            resync();
          } catch (e) {
            if (e.login) return fail(e);
            setResult(result, `${purged ? `Purged ${plural(purged, 'task')}, then: ` : ''}${e.message}`, 'error');
          } finally { button.disabled = false; }
        });
    });
    return h('section', { class: 'card' }, h('h2', { text: 'Purge' }),
      h('div', { class: 'card-body' },
        h('p', { class: 'muted', text: 'Deletes finished tasks (completed, failed, cancelled), as the expiry reaper would, in batches.' }),
        form, result));
  }

  // ---- Task list.

  /** A time filter as ms (a date, a date and time without offset = UTC, RFC 3339, or ms). */
  function parseTime(v) {
    v = v.trim();
    if (/^\d+$/.test(v)) return Number(v);
    if (/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?$/.test(v)) v += 'Z';
    return Date.parse(v);
  }

  /** Whether a row matches the list's filters (to count new tasks the live stream brings). */
  function matches(row, f) {
    if (f.status && row.status !== f.status.trim()) return false;
    if (f.tool && row.tool !== f.tool.trim()) return false;
    if (f.owner) {
      const o = f.owner.trim(), i = o.indexOf('/');
      const [tenant, principal] = i < 0 ? ['', o] : [o.slice(0, i), o.slice(i + 1)];
      if (!row.owner || row.owner.tenant !== tenant || row.owner.principal !== principal) return false;
    }
    if (f.q) {
      const q = f.q.toLowerCase();
      if (!row.id.toLowerCase().includes(q) && !(row.statusMessage || '').toLowerCase().includes(q)) return false;
    }
    const from = f.from ? parseTime(f.from) : NaN, to = f.to ? parseTime(f.to) : NaN;
    if (!Number.isNaN(from) && row.createdAt < from) return false;
    if (!Number.isNaN(to) && row.createdAt >= to) return false;
    return true;
  }

  function filterForm(f, limit) {
    const field = (name, label, input) => h('div', { class: 'field' }, h('label', { for: `f-${name}`, text: label }), input);
    const text = (name, placeholder) => h('input', { id: `f-${name}`, name, type: name === 'q' ? 'search' : 'text', value: f[name] || '', placeholder, autocomplete: 'off', spellcheck: 'false' });
    const select = h('select', { id: 'f-status', name: 'status' }, h('option', { value: '', text: 'any' }),
      STATUSES.map((st) => h('option', { value: st, text: st, selected: f.status === st })));
    const form = h('form', { id: 'filters', class: 'filters', method: 'get', action: `${ROOT}tasks`, role: 'search' },
      field('status', 'Status', select),
      field('tool', 'Tool', text('tool', 'exact name')),
      field('owner', 'Owner', text('owner', 'tenant/principal')),
      field('from', 'Created from', text('from', '2026-12-04 (UTC)')),
      field('to', 'Created before', text('to', '2026-12-04T10:00')),
      field('q', 'Search', text('q', 'id or status message')),
      limit ? h('input', { type: 'hidden', name: 'limit', value: limit }) : null,
      h('div', { class: 'field buttons' }, h('button', { class: 'btn btn-primary', type: 'submit', text: 'Filter' }),
        h('a', { class: 'btn btn-ghost', href: `${ROOT}tasks`, text: 'Clear' })));
    // Empty fields stay out of the URL (the form still submits natively, with GET).
    form.addEventListener('submit', () => {
      for (const el of form.elements) if (el.name && !el.value.trim()) el.disabled = true;
    });
    window.addEventListener('pageshow', () => { for (const el of form.elements) el.disabled = false; });
    return form;
  }

  function taskRow(t) {
    return h('tr', { 'data-task-id': t.id },
      h('td', { class: 'id' }, h('a', { class: 'mono', href: taskUrl(t.id), text: t.id })),
      h('td', { class: 'tool', text: t.tool }),
      h('td', { class: 'status' }, badge(t.status, t.isError)),
      h('td', { class: 'message', title: t.statusMessage || null, text: t.statusMessage || '' }),
      h('td', { class: 'owner', text: fmtOwner(t.owner) }),
      h('td', { class: 'created' }, timeEl(t.createdAt)),
      h('td', { class: 'updated' }, timeEl(t.lastUpdatedAt)));
  }

  async function pageList() {
    setTitle('Tasks');
    setNav('tasks');
    const params = new URLSearchParams(location.search);
    const f = {};
    for (const k of FILTERS) { const v = params.get(k); if (v && v.trim()) f[k] = v; }
    const cursor = params.get('cursor') || '';
    const limit = params.get('limit') || '';
    const searchedBefore = Number(params.get('scanned')) || 0; // our own: the scan so far
    const query = () => {
      const q = new URLSearchParams(f);
      if (cursor) q.set('cursor', cursor);
      if (limit) q.set('limit', limit);
      return q.toString() ? `?${q}` : '';
    };
    const [oRes, pRes] = await Promise.allSettled([loadOverview(), api(`api/tasks${query()}`)]);
    for (const r of [oRes, pRes]) if (r.status === 'rejected' && r.reason.login) throw r.reason;
    if (oRes.status === 'rejected') throw oRes.reason;

    const m = clearMain();
    const summary = h('span', { class: 'muted' });
    const filterError = h('p', { id: 'filter-error', class: 'form-error', role: 'alert', hidden: true });
    const result = h('div', { id: 'action-result', class: 'action-result', role: 'status', hidden: true });
    const notice = h('div', { id: 'new-tasks', class: 'notice', hidden: true });
    const tableBox = h('div', { class: 'card' });
    const pager = h('div', { class: 'pager' });
    const toolbar = h('div', { class: 'toolbar' });
    const filtered = Object.keys(f).length > 0;
    add(m, [
      h('div', { class: 'page-head' }, h('h1', { text: 'Tasks' }), summary, toolbar),
      filterForm(f, limit), filterError, result, notice, tableBox, pager,
    ]);

    const fresh = new Set();
    let threshold = Infinity;
    const shown = () => new Set(Array.from(tableBox.querySelectorAll('tr[data-task-id]'), (tr) => tr.dataset.taskId));

    const render = (page) => {
      tableBox.textContent = '';
      pager.textContent = '';
      fresh.clear();
      notice.hidden = true;
      const tasks = page.tasks || [];
      tableBox.append(table('tasks-table',
        [['ID'], ['Tool'], ['Status'], ['Message'], ['Owner'], ['Created'], ['Updated']],
        tasks.map(taskRow),
        page.complete === false ? 'No match yet in the tasks searched so far.' : filtered ? 'No task matches these filters.' : 'No tasks yet.'));
      summary.textContent = `${plural(tasks.length, 'task')} on this page${cursor ? ' (older)' : ''} · newest first`;
      // What counts as new: created after the newest row of the first page (any time later
      // than now on later pages, or any match at all when the complete first page is empty).
      const newest = Math.max(...tasks.map((t) => t.createdAt));
      threshold = cursor ? (state.overview ? state.overview.now : now()) : tasks.length ? newest : page.complete === false ? now() : -Infinity;
      const next = (extra) => listUrl({ ...f, limit, cursor: page.next, ...extra });
      if (page.complete === false && page.next) {
        const searched = searchedBefore + (page.scanned || 0);
        pager.append(h('p', { class: 'notice scan' }, `Searched ${plural(searched, 'task')} so far — `,
          h('a', { id: 'next-page', href: next({ scanned: searched }), text: 'continue' })));
      } else if (page.next) {
        pager.append(h('a', { id: 'next-page', class: 'btn', href: next(), text: 'Older tasks →' }));
      }
      if (cursor) pager.append(h('a', { class: 'btn btn-ghost', href: listUrl({ ...f, limit }), text: '← Newest' }));
    };

    if (pRes.status === 'rejected') {
      const e = pRes.reason;
      if (e.status === 400 || e.status === 403) { // a bad filter, or another owner's tasks
        filterError.textContent = e.message;
        filterError.hidden = false;
        render({ tasks: [], next: null, complete: true });
        summary.textContent = '';
        $('tr.empty td', tableBox).textContent = 'Correct the filters above.';
      } else { render({ tasks: [], next: null, complete: true }); fail(e); }
    } else render(pRes.value);

    if (state.actions) {
      const cancellable = !f.status || f.status === 'working' || f.status === 'input_required';
      const btn = h('button', { id: 'cancel-matching', class: 'btn btn-danger-outline', type: 'button', text: 'Cancel all matching…', disabled: !cancellable || !!filterError.textContent,
        title: cancellable ? 'Cancel every working or input_required task these filters match' : 'These filters match finished tasks only' });
      btn.addEventListener('click', () => cancelMatching(btn, f, result, reload));
      toolbar.append(btn);
    }

    const reload = async () => { render(await api(`api/tasks${query()}`)); };
    state.page = {
      resync: limiter(() => (filterError.hidden ? reload() : null), 1000),
      onTask(row) {
        if (!filterError.hidden) return;
        const tr = tableBox.querySelector(`tr[data-task-id="${CSS.escape(row.id)}"]`);
        if (tr) {
          const td = (c) => $(`td.${c}`, tr);
          td('status').replaceChildren(badge(row.status, row.isError));
          td('message').textContent = row.statusMessage || '';
          td('message').title = row.statusMessage || '';
          td('updated').replaceChildren(timeEl(row.lastUpdatedAt));
          tr.classList.remove('flash');
          void tr.offsetWidth; // restart the highlight animation
          tr.classList.add('flash');
          return;
        }
        if (fresh.has(row.id) || row.createdAt <= threshold || !matches(row, f) || shown().has(row.id)) return;
        fresh.add(row.id);
        notice.textContent = '';
        add(notice, [`${plural(fresh.size, 'new task')} — `, h('a', { href: listUrl({ ...f, limit }), text: 'show' })]);
        notice.hidden = false;
      },
    };
  }

  async function cancelMatching(btn, f, result, reload) {
    setResult(result, 'Counting the matching tasks…', 'progress');
    btn.disabled = true;
    let total = 0, exact = true;
    try {
      // Only working and input_required tasks can be cancelled: count those.
      const statuses = f.status ? [f.status] : ['working', 'input_required'];
      for (const st of statuses) {
        const c = await api(`api/tasks/count?${new URLSearchParams({ ...f, status: st })}`);
        total += c.count;
        exact = exact && c.exact;
      }
    } catch (e) {
      btn.disabled = false;
      if (e.login) return fail(e);
      return setResult(result, e.message, 'error');
    }
    btn.disabled = false;
    if (total === 0) return setResult(result, 'No working or input_required task matches these filters.', 'ok');
    setResult(result, '');
    const n = `${exact ? '' : 'at least '}${plural(total, 'task')}`;
    askConfirm($('#filters'), `Cancel ${n} matching these filters?`, async () => {
      btn.disabled = true;
      let cancelled = 0, refused = 0, cursor = null;
      try {
        for (;;) {
          setResult(result, `Cancelling… ${fmtNum(cancelled)} of ${n} so far`, 'progress');
          const r = await api(`api/cancel?${new URLSearchParams(f)}`, { method: 'POST', body: cursor ? { expected: total, cursor } : { expected: total } });
          cancelled += r.cancelled || 0;
          refused += r.refused || 0;
          cursor = r.cursor || null;
          if (!r.more) break;
        }
        setResult(result, `Cancellation requested for ${plural(cancelled, 'task')}${refused ? ` (${fmtNum(refused)} refused)` : ''}.`, 'ok');
      } catch (e) {
        if (e.login) return fail(e);
        setResult(result, `${cancelled ? `${plural(cancelled, 'task')} cancelled, then: ` : ''}${e.message}`, 'error');
      } finally { btn.disabled = false; }
      try { await reload(); } catch (e) { fail(e); }
    });
  }

  // ---- A task's page.

  async function pageDetail(id) {
    setTitle(id);
    setNav('tasks');
    const [oRes, tRes] = await Promise.allSettled([loadOverview(), api(`api/tasks/${encodeURIComponent(id)}`)]);
    for (const r of [oRes, tRes]) if (r.status === 'rejected' && r.reason.login) throw r.reason;
    if (tRes.status === 'rejected' && tRes.reason.status === 404) return renderNotFound(id);
    if (oRes.status === 'rejected') throw oRes.reason;
    if (tRes.status === 'rejected') throw tRes.reason;

    const m = clearMain();
    const status = h('span', { id: 'task-status', class: 'badge badge-lg' });
    const message = h('p', { id: 'task-message', class: 'task-message' });
    const actions = h('div', { class: 'head-actions' });
    const result = h('div', { id: 'action-result', class: 'action-result', role: 'status', hidden: true });
    const body = h('div', { class: 'detail' });
    add(m, [
      h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: `${ROOT}tasks`, text: 'Tasks' }), h('span', { text: ' › ' }), h('span', { class: 'mono', text: id })),
      h('div', { class: 'page-head task-head' }, h('h1', { id: 'task-id', class: 'mono', text: id }), status, actions),
      message, result, body,
    ]);

    const head = (t) => {
      const toolError = t.isError && t.status === 'completed';
      status.textContent = toolError ? 'completed · tool error' : t.status;
      status.className = `badge badge-lg st-${toolError ? 'failed tool-error' : t.status}`;
      status.title = toolError ? 'The tool\'s result has isError: true' : '';
      message.textContent = t.statusMessage || '';
      message.hidden = !t.statusMessage;
    };
    const fill = (t) => {
      head(t);
      actions.textContent = '';
      if (t.cancelRequested && (t.status === 'working' || t.status === 'input_required')) {
        actions.append(h('span', { class: 'tag warn', text: 'cancellation requested' }));
      }
      if (state.actions && (t.status === 'working' || t.status === 'input_required')) {
        const btn = h('button', { id: 'cancel-task', class: 'btn btn-danger-outline', type: 'button', text: 'Cancel task' });
        btn.addEventListener('click', () => askConfirm(message,
          `Cancel task ${t.id}? A task waiting for input is cancelled at once; a running tool is asked to stop.`,
          () => cancelOne(btn, result)));
        actions.append(btn);
      }
      keepFolds(body, () => { body.textContent = ''; add(body, detailBody(t)); });
    };
    const refetch = async () => {
      try { fill(await api(`api/tasks/${encodeURIComponent(id)}`)); } catch (e) {
        if (e.status === 404) { state.page = null; renderNotFound(id); } else throw e;
      }
    };
    const cancelOne = async (btn, out) => {
      btn.disabled = true;
      setResult(out, 'Requesting cancellation…', 'progress');
      try {
        const r = await api(`api/tasks/${encodeURIComponent(id)}/cancel`, { method: 'POST', body: {} });
        setResult(out, r.status === 'cancelled' ? 'The task is cancelled.' : `Cancellation requested: the task is ${r.status} while its tool winds down.`, 'ok');
      } catch (e) {
        if (e.login) return fail(e);
        setResult(out, e.message, 'error');
        btn.disabled = false;
      }
      await refetch();
    };
    fill(tRes.value);
    const later = limiter(refetch, 500);
    state.page = {
      resync: later,
      onTask(row) {
        if (row.id !== id) return;
        head(row);
        const upd = $('#task-updated');
        if (upd) upd.replaceChildren(timeEl(row.lastUpdatedAt));
        later();
      },
    };
  }

  function section(id, title, ...kids) {
    return h('section', { id, class: 'card' }, h('h2', { text: title }), h('div', { class: 'card-body' }, kids));
  }

  /** The text parts of an MCP tool result (content[].text), if any. */
  function resultText(r) {
    if (!r || !Array.isArray(r.content)) return '';
    const t = r.content.filter((c) => c && c.type === 'text' && typeof c.text === 'string').map((c) => c.text).join('\n');
    return t.length > 4000 ? `${t.slice(0, 4000)}…` : t;
  }

  function detailBody(t) {
    const pending = Object.entries(t.inputRequests || {});
    const answered = t.answeredKeys || [];
    const inputs = section('input-requests', 'Input requests',
      pending.length ? null : h('p', { class: 'muted', text: 'No pending input request.' }),
      pending.map(([key, req]) => h('div', { class: 'input-request', 'data-input-key': key },
        h('div', { class: 'input-head' }, h('code', { class: 'key', text: key }), h('span', { class: 'muted', text: req && req.method ? req.method : '' })),
        req && req.params && typeof req.params.message === 'string' ? h('p', { class: 'input-message', text: req.params.message }) : null,
        fold(req && req.params !== undefined ? req.params : req, `input:${key}`, 'params'))),
      answered.length ? h('p', { class: 'muted' }, 'Answered: ', answered.map((k, i) => [i ? ', ' : '', h('code', { text: k })])) : null);
    inputs.hidden = !pending.length && !answered.length && t.status !== 'input_required';
    if (pending.length) inputs.classList.add('attention');

    let res;
    if (t.error) {
      res = section('result', 'Error', h('div', { class: 'error-box' },
        h('div', null, h('span', { class: 'error-code', text: `code ${t.error.code}` })),
        h('p', { class: 'error-message', text: t.error.message || '' }),
        t.error.data != null ? fold(t.error.data, 'error-data', 'data') : null));
    } else if (t.result != null) {
      const text = resultText(t.result);
      res = section('result', t.result.isError ? 'Result (tool error)' : 'Result',
        text ? h('pre', { class: t.result.isError ? 'result-text error-message' : 'result-text', text }) : null, fold(t.result, 'result'));
      if (t.result.isError) res.classList.add('tool-error');
    } else {
      res = section('result', 'Result', h('p', { class: 'muted', text: t.status === 'working' || t.status === 'input_required' ? 'No result yet.' : `No result: the task is ${t.status}.` }));
    }

    const steps = section('steps', 'Journal steps', t.steps && t.steps.length
      ? h('div', { class: 'table-wrap' }, h('table', { class: 'table steps' },
        h('thead', null, h('tr', null, h('th', { text: 'Step' }), h('th', { class: 'num', text: 'Attempt' }), h('th', { text: 'Value' }))),
        h('tbody', null, t.steps.map((st, i) => h('tr', null,
          h('td', { class: 'mono name', text: st.name }),
          h('td', { class: 'num', text: st.attempt == null ? '—' : String(st.attempt) }),
          h('td', null, fold(st.value, `step:${i}:${st.name}`)))))))
      : h('p', { class: 'muted', text: 'No journal step committed.' }));

    const lease = t.lease ? `${t.lease.node} · epoch ${t.lease.epoch} · ${plural(t.lease.takeovers, 'takeover')}` : '—';
    const facts = dl([
      ['Tool', h('a', { href: listUrl({ tool: t.tool }), text: t.tool })],
      ['Upstream', t.upstream ? h('span', { id: 'task-upstream', class: 'mono', text: t.upstream }) : undefined],
      ['Owner', h('a', { href: listUrl({ owner: ownerParam(t.owner) }), text: fmtOwner(t.owner) })],
      ['Created', timeEl(t.createdAt)],
      ['Last updated', timeEl(t.lastUpdatedAt), 'task-updated'],
      ['TTL', t.ttlMs == null ? 'none' : fmtDuration(t.ttlMs)],
      ['Expires', t.expiresAt == null ? 'never' : timeEl(t.expiresAt)],
      ['Attempts', String(t.attempts ?? '—')],
      ['Poll interval', t.pollIntervalMs == null ? undefined : fmtDuration(t.pollIntervalMs)],
      ['Cancel requested', t.cancelRequested ? 'yes' : 'no'],
      ['Lease', lease, 'lease'],
    ]);
    const timeline = h('ol', { id: 'timeline', class: 'timeline' }, (t.timeline || []).map((e) => h('li', { class: `st-${e.status}` },
      h('div', { class: 'tl-head' }, badge(e.status), timeEl(e.at)),
      e.statusMessage ? h('div', { class: 'tl-msg', text: e.statusMessage }) : null)));

    return [
      h('div', { class: 'detail-main' }, pending.length ? inputs : null, res,
        section('arguments', 'Arguments', fold(t.arguments, 'arguments')), steps, pending.length ? null : inputs),
      h('aside', { class: 'detail-side' },
        h('section', { class: 'card' }, h('h2', { text: 'Details' }), h('div', { class: 'card-body' }, facts)),
        h('section', { class: 'card' }, h('h2', { text: 'Timeline' }), h('div', { class: 'card-body' }, timeline))),
    ];
  }

  // ---- Not found, login.

  function renderNotFound(id) {
    document.title = 'Not found — mcp-tasks console';
    const m = clearMain();
    m.append(h('section', { id: 'not-found', class: 'card empty-state' },
      h('h1', { text: 'Not found' }),
      id ? h('p', null, 'There is no task ', h('code', { text: id }), ' — it may have expired, been purged, or belong to another principal.')
        : h('p', { text: 'There is no page at this address.' }),
      h('p', { class: 'links' }, h('a', { class: 'btn', href: ROOT, text: 'Overview' }), h('a', { class: 'btn', href: `${ROOT}tasks`, text: 'All tasks' }))));
    markReady();
  }

  function renderLogin(message) {
    stopLive();
    state.page = null;
    setLive('off', 'offline');
    document.title = 'Sign in — mcp-tasks console';
    setNav('');
    $('#viewer').textContent = '';
    $('#sign-out').hidden = true;
    const input = h('input', { id: 'login-token', name: 'token', type: 'password', required: true, autocomplete: 'off', spellcheck: 'false', placeholder: 'bearer token or JWT' });
    const error = h('p', { id: 'login-error', class: 'form-error', role: 'alert' });
    const button = h('button', { class: 'btn btn-primary', type: 'submit', text: 'Sign in' });
    const form = h('form', { id: 'login-form', class: 'login-form' },
      h('label', { for: 'login-token', text: 'Token' }), input, button, error);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      error.textContent = '';
      button.disabled = true;
      try {
        await api('api/session', { method: 'POST', body: { token: input.value.trim() } });
        location.reload();
      } catch (err) {
        error.textContent = err.message;
        button.disabled = false;
        input.select();
      }
    });
    const m = clearMain();
    m.append(h('section', { class: 'card login' },
      h('h1', { text: 'Sign in' }),
      h('p', { class: 'muted', text: 'This console asks for the same credential as the MCP endpoint: a bearer token or a JWT.' }),
      message && message !== 'sign in with a token' ? h('p', { class: 'note', text: message }) : null,
      form));
    input.focus();
    markReady();
  }

  async function signOut() {
    try { await api('api/session', { method: 'DELETE' }); location.reload(); } catch (e) { fail(e); }
  }

  // ---- The router: location.pathname relative to the root.

  function route() {
    const path = location.pathname;
    let rel = null;
    if (path.startsWith(ROOT)) rel = path.slice(ROOT.length);
    else if (`${path}/` === ROOT) rel = '';
    if (SHELL_STATUS === '404' || rel === null) {
      const m = rel && /^tasks\/([^/]+)$/.exec(rel);
      return { page: 'notfound', id: m ? safeDecode(m[1]) : null };
    }
    if (rel === '') return { page: 'overview' };
    if (rel === 'tasks') return { page: 'list' };
    const m = /^tasks\/([^/]+)$/.exec(rel);
    if (m) return { page: 'detail', id: safeDecode(m[1]) };
    return { page: 'notfound', id: null };
  }

  function safeDecode(s) { try { return decodeURIComponent(s); } catch (e) { return s; } }

  function boot() {
    $('#sign-out').addEventListener('click', signOut);
    window.addEventListener('pagehide', stopLive);
    const r = route();
    let run;
    if (r.page === 'overview') run = pageOverview();
    else if (r.page === 'list') run = pageList();
    else if (r.page === 'detail') run = pageDetail(r.id);
    else {
      renderNotFound(r.id);
      // The header still shows who is looking (quietly: the page is shown either way).
      run = loadOverview().catch(() => false);
    }
    run.then((ok) => { if (ok !== false && !$('#login-form')) startLive(); })
      .catch(fail)
      .finally(markReady);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
  else boot();
})();
