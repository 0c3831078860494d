#include "tools/memprof/html.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace strata::memprof {
namespace {

using nlohmann::json;

// The page. The data goes where DATA_JSON is; everything else is static.
constexpr const char* kPage = R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>memprof</title>
<style>
  body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 24px; color: #222; background: #fff; }
  h1 { font-size: 18px; margin: 0 0 2px 0; }
  .sub { color: #666; margin-bottom: 10px; }
  .legend { display: flex; flex-wrap: wrap; gap: 14px; margin: 6px 0 10px 0; align-items: center; }
  .legend span.sw { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 5px; vertical-align: -2px; }
  .panel { position: relative; margin-bottom: 6px; }
  .panel canvas { display: block; }
  .panel canvas.overlay { position: absolute; left: 0; top: 0; }
  .ptitle { font-weight: 600; margin: 4px 0 0 0; }
  .ptitle .cap { font-weight: 400; color: #666; margin-left: 8px; }
  #tip { position: fixed; pointer-events: none; background: rgba(255,255,255,0.97); border: 1px solid #bbb;
         border-radius: 4px; padding: 6px 8px; box-shadow: 0 2px 8px rgba(0,0,0,0.15); display: none; z-index: 10; }
  #tip table { border-collapse: collapse; }
  #tip td, #tip th { padding: 1px 6px; text-align: right; white-space: nowrap; }
  #tip th { text-align: left; font-weight: 600; }
  #tip .hot { background: #f3f6fb; }
  .tables { display: flex; flex-wrap: wrap; gap: 28px; margin-top: 14px; }
  table.t { border-collapse: collapse; }
  table.t th, table.t td { padding: 2px 8px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
  table.t th { background: #f6f6f6; }
  table.t td:first-child, table.t th:first-child { text-align: left; }
  .note { color: #a40; }
</style></head>
<body>
<h1 id="title"></h1>
<div class="sub" id="sub"></div>
<div class="legend" id="legend"></div>
<div id="panels"></div>
<div class="tables" id="tables"></div>
<div id="tip"></div>
<script type="application/json" id="data">DATA_JSON</script>
<script>
(function () {
  const D = JSON.parse(document.getElementById('data').textContent);
  const COLORS = { param: '#4e79a7', grad: '#f28e2b', master: '#59a14f', exp_avg: '#76b7b2',
                   exp_avg_sq: '#edc948', staging: '#b07aa1', activation: '#e15759' };
  const PHASE = { forward: 'rgba(78,121,167,0.09)', backward: 'rgba(242,142,43,0.10)',
                  optimizer: 'rgba(89,161,79,0.11)', idle: null };
  const M = { l: 78, r: 16, t: 8, b: 22 };
  const H = 190;
  function fmt(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0; let v = b;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    return (i ? v.toFixed(v < 10 ? 2 : 1) : v.toFixed(0)) + ' ' + u[i];
  }
  function fmtT(s) { return s < 10 ? s.toFixed(3) + ' s' : s.toFixed(2) + ' s'; }
  // Tick steps of 1, 2, 2.5 or 5 times a power of ten (of 1024 for bytes) giving about `want` ticks.
  function niceStep(span, want, base) {
    const raw = span / want;
    if (base === 1024) {
      let unit = 1; while (raw / unit >= 1024) unit *= 1024;
      for (const m of [1, 2, 5, 10, 20, 50, 100, 200, 500]) if (m * unit >= raw) return m * unit;
      return 1024 * unit;
    }
    const unit = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * unit >= raw) return m * unit;
    return 10 * unit;
  }
  function fmtTick(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0; let v = b;
    while (v >= 1024 && i < 4) { v /= 1024; i++; }
    return parseFloat(v.toFixed(2)) + ' ' + u[i];
  }
  const el = (tag, attrs, text) => { const e = document.createElement(tag);
    Object.assign(e, attrs || {}); if (text !== undefined) e.textContent = text; return e; };

  document.title = 'memprof: ' + D.title;
  document.getElementById('title').textContent = 'memprof: ' + D.title;
  document.getElementById('sub').textContent = D.backend + ' \u2014 ' + fmtT(D.end) + ' traced, ' +
      D.summary.events + ' events, ' + D.summary.tensors + ' tensors, steps ' + D.summary.first_step + '..' +
      D.summary.last_step + (D.summary.exact ? '' : ' \u2014 events were dropped: the timeline is approximate');
  const legend = document.getElementById('legend');
  D.kinds.forEach(k => { const s = el('span'); const sw = el('span', { className: 'sw' });
    sw.style.background = COLORS[k]; s.appendChild(sw); s.appendChild(document.createTextNode(k)); legend.appendChild(s); });
  ['forward', 'backward', 'optimizer'].forEach(p => { const s = el('span'); const sw = el('span', { className: 'sw' });
    sw.style.background = PHASE[p].replace(/[\d.]+\)$/, '0.35)'); s.appendChild(sw);
    s.appendChild(document.createTextNode(p + ' phase')); legend.appendChild(s); });
  const capSw = el('span', {}, '- - capacity'); capSw.style.color = '#c0392b'; legend.appendChild(capSw);

  const t = D.t; const n = t.length; const t0 = 0; const t1 = Math.max(D.end, t[n - 1] || 0, 1e-9);
  const panels = [];
  const root = document.getElementById('panels');
  D.tiers.forEach((tier, ti) => {
    if (!tier.present) return;
    const peak = tier.rows.reduce((m, r) => Math.max(m, r.reduce((a, b) => a + b, 0)), 0);
    const capOn = tier.capacity > 0 && tier.capacity <= 4 * Math.max(peak, 1);
    const ymax = Math.max(capOn ? tier.capacity : 0, peak, 1) * 1.06;
    const title = el('div', { className: 'ptitle' }, tier.name);
    title.appendChild(el('span', { className: 'cap' }, 'peak ' + fmt(peak) + ' \u00b7 capacity ' +
        (tier.capacity ? fmt(tier.capacity) + (capOn ? '' : ' (off scale)') : 'unlimited')));
    root.appendChild(title);
    const box = el('div', { className: 'panel' });
    const cv = el('canvas'); const ov = el('canvas', { className: 'overlay' });
    box.appendChild(cv); box.appendChild(ov); root.appendChild(box);
    panels.push({ tier, ti, cv, ov, ymax, capOn });
  });

  function layout() {
    const W = Math.max(600, document.body.clientWidth);
    const dpr = window.devicePixelRatio || 1;
    panels.forEach(p => {
      [p.cv, p.ov].forEach(c => { c.width = W * dpr; c.height = H * dpr; c.style.width = W + 'px';
        c.style.height = H + 'px'; c.getContext('2d').setTransform(dpr, 0, 0, dpr, 0, 0); });
      p.W = W; draw(p);
    });
  }
  const X = (p, s) => M.l + (s - t0) / (t1 - t0) * (p.W - M.l - M.r);
  const Y = (p, b) => M.t + (1 - b / p.ymax) * (H - M.t - M.b);

  function draw(p) {
    const g = p.cv.getContext('2d');
    g.clearRect(0, 0, p.W, H);
    const x0 = M.l, x1 = p.W - M.r, yTop = M.t, yBot = H - M.b;
    // phase bands
    for (let i = 0; i < D.markers.length; i++) {
      const m = D.markers[i]; const c = PHASE[m.phase]; if (!c) continue;
      const a = X(p, m.t), b = X(p, i + 1 < D.markers.length ? D.markers[i + 1].t : t1);
      g.fillStyle = c; g.fillRect(a, yTop, Math.max(1, b - a), yBot - yTop);
    }
    // grid and y labels
    g.strokeStyle = '#e4e4e4'; g.fillStyle = '#555'; g.font = '11px system-ui, sans-serif';
    g.textAlign = 'right'; g.textBaseline = 'middle'; g.lineWidth = 1;
    const ys = niceStep(p.ymax, 4, 1024);
    for (let v = 0; v <= p.ymax; v += ys) {
      const y = Math.round(Y(p, v)) + 0.5;
      g.beginPath(); g.moveTo(x0, y); g.lineTo(x1, y); g.stroke(); g.fillText(fmtTick(v), x0 - 6, y);
    }
    // stacked areas, as step functions
    const base = new Float64Array(n);
    D.kinds.forEach((k, ki) => {
      const rows = p.tier.rows; let any = false;
      for (let i = 0; i < n; i++) if (rows[i][ki] > 0) { any = true; break; }
      if (!any) return;
      g.beginPath();
      for (let i = 0; i < n; i++) {
        const xa = X(p, t[i]), xb = X(p, i + 1 < n ? t[i + 1] : t1), y = Y(p, base[i] + rows[i][ki]);
        if (i === 0) g.moveTo(xa, y); else g.lineTo(xa, y);
        g.lineTo(xb, y);
      }
      for (let i = n - 1; i >= 0; i--) {
        const xa = X(p, t[i]), xb = X(p, i + 1 < n ? t[i + 1] : t1), y = Y(p, base[i]);
        g.lineTo(xb, y); g.lineTo(xa, y);
      }
      g.closePath(); g.fillStyle = COLORS[k]; g.globalAlpha = 0.88; g.fill(); g.globalAlpha = 1;
      for (let i = 0; i < n; i++) base[i] += rows[i][ki];
    });
    // capacity
    if (p.capOn) {
      const y = Math.round(Y(p, p.tier.capacity)) + 0.5;
      g.save(); g.setLineDash([6, 4]); g.strokeStyle = '#c0392b'; g.lineWidth = 1.3;
      g.beginPath(); g.moveTo(x0, y); g.lineTo(x1, y); g.stroke(); g.restore();
    }
    // step markers
    g.strokeStyle = 'rgba(60,60,60,0.45)'; g.fillStyle = '#333'; g.textAlign = 'left'; g.textBaseline = 'top';
    let lastLabel = -1e9, lastStep = null;
    D.markers.forEach(m => {
      if (m.step === lastStep) return; lastStep = m.step;
      const x = Math.round(X(p, m.t)) + 0.5;
      g.beginPath(); g.moveTo(x, yTop); g.lineTo(x, yBot); g.stroke();
      if (p === panels[0] && x - lastLabel > 46) { g.fillText('step ' + m.step, x + 3, yTop + 1); lastLabel = x; }
    });
    // axes and x labels
    g.strokeStyle = '#888'; g.beginPath(); g.moveTo(x0 + 0.5, yTop); g.lineTo(x0 + 0.5, yBot);
    g.lineTo(x1, yBot + 0.5); g.stroke();
    g.fillStyle = '#555'; g.textAlign = 'center'; g.textBaseline = 'top';
    const xs = niceStep(t1 - t0, Math.max(2, Math.floor((x1 - x0) / 120)), 10);
    for (let s = t0; s <= t1 + 1e-12; s += xs) {
      const x = X(p, s); g.beginPath(); g.moveTo(Math.round(x) + 0.5, yBot); g.lineTo(Math.round(x) + 0.5, yBot + 3);
      g.stroke(); g.textAlign = x > x1 - 30 ? 'right' : 'center'; g.fillText(parseFloat(s.toPrecision(6)) + ' s', x, yBot + 4);
    }
  }

  const tip = document.getElementById('tip');
  function indexAt(s) { let lo = 0, hi = n - 1; if (s < t[0]) return 0;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (t[mid] <= s) lo = mid; else hi = mid - 1; } return lo; }
  function phaseAt(s) { let m = null; for (const mk of D.markers) { if (mk.t <= s) m = mk; else break; } return m; }
  function hover(ev, hot) {
    const r = hot.ov.getBoundingClientRect(); const x = ev.clientX - r.left;
    if (x < M.l || x > hot.W - M.r) { leave(); return; }
    const s = t0 + (x - M.l) / (hot.W - M.l - M.r) * (t1 - t0);
    const i = indexAt(s);
    panels.forEach(p => { const g = p.ov.getContext('2d'); g.clearRect(0, 0, p.W, H);
      g.strokeStyle = 'rgba(0,0,0,0.7)'; g.beginPath(); g.moveTo(Math.round(x) + 0.5, M.t);
      g.lineTo(Math.round(x) + 0.5, H - M.b); g.stroke(); });
    const m = phaseAt(s);
    let h = '<div><b>' + fmtT(s) + '</b> \u00b7 step ' + (m ? m.step : D.first_step) + ' \u00b7 ' +
            (m ? m.phase : 'idle') + '</div><table><tr><th></th>';
    D.kinds.forEach(k => { h += '<th style="color:' + COLORS[k] + '">' + k + '</th>'; });
    h += '<th>total</th></tr>';
    panels.forEach(p => { const row = p.tier.rows[i]; const tot = row.reduce((a, b) => a + b, 0);
      h += '<tr' + (p === hot ? ' class="hot"' : '') + '><th>' + p.tier.name + '</th>';
      row.forEach(v => { h += '<td>' + (v ? fmt(v) : '\u00b7') + '</td>'; });
      h += '<td><b>' + fmt(tot) + '</b></td></tr>'; });
    tip.innerHTML = h + '</table>'; tip.style.display = 'block';
    const tw = tip.offsetWidth, th = tip.offsetHeight;
    let left = ev.clientX + 16, top = ev.clientY + 14;
    if (left + tw > window.innerWidth - 4) left = ev.clientX - tw - 16;
    if (top + th > window.innerHeight - 4) top = ev.clientY - th - 14;
    tip.style.left = left + 'px'; tip.style.top = top + 'px';
  }
  function leave() { tip.style.display = 'none';
    panels.forEach(p => p.ov.getContext('2d').clearRect(0, 0, p.W, H)); }
  panels.forEach(p => { p.ov.addEventListener('mousemove', ev => hover(ev, p));
    p.ov.addEventListener('mouseleave', leave); });
  window.addEventListener('resize', layout);
  layout();

  // tables
  const S = D.summary; const tables = document.getElementById('tables');
  function table(caption, head, rows) {
    const wrap = el('div'); wrap.appendChild(el('div', { className: 'ptitle' }, caption));
    const tb = el('table', { className: 't' }); const tr = el('tr');
    head.forEach(hd => tr.appendChild(el('th', {}, hd))); tb.appendChild(tr);
    rows.forEach(r => { const row = el('tr'); r.forEach(c => row.appendChild(el('td', {}, c))); tb.appendChild(row); });
    wrap.appendChild(tb); tables.appendChild(wrap);
  }
  table('Peak bytes per tier and kind', ['tier'].concat(D.kinds, ['tier peak', 'capacity']),
        D.tiers.filter(x => x.present).map(x => [x.name].concat(D.kinds.map(k => fmt(S.tiers[x.name].peak[k])),
        [fmt(S.tiers[x.name].peak_total), x.capacity ? fmt(x.capacity) : 'unlimited'])));
  table('Moves', ['direction', 'count', 'bytes'],
        Object.keys(S.moves).map(d => [d.replace(/_to_/, ' \u2192 '), String(S.moves[d].count), fmt(S.moves[d].bytes)]));
  table('Evictions and OOMs', ['what', 'count', 'bytes'],
        [['evictions', String(S.evictions), fmt(S.evicted_bytes)], ['failed moves', String(S.failed_moves), ''],
         ['out of memory', String(S.ooms), '']]);
  table('Largest tensors', ['name', 'kind', 'bytes', 'home'],
        S.largest.map(x => [x.name, x.kind, fmt(x.bytes), x.home]));
})();
</script>
</body></html>
)HTML";

// JSON inside <script>: "</" must not appear verbatim.
std::string script_safe(std::string s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::string render_html(const Trace& tr, const HtmlOptions& opts) {
  std::vector<TimelinePoint> pts = replay(tr);
  Summary sum = summarize(tr);
  const std::int64_t t0 = tr.start_t;
  // Seconds from the start, in double: a damaged trace's times may be anywhere in int64, where the
  // difference would overflow.
  auto since = [t0](std::int64_t t) { return double(t) - double(t0); };
  std::int64_t t_end = std::max(pts.back().t_ns, tr.end_t);
  if (!tr.samples.empty()) t_end = std::max(t_end, tr.samples.back().t_ns);

  // Bucket the points in time; in each bucket every tier keeps the point with its highest total, so
  // that no peak disappears from the picture.
  const std::size_t nb = std::max<std::size_t>(1, std::min(opts.max_points, pts.size()));
  const double width = std::max(1.0, since(t_end)) / double(nb);
  json times = json::array();
  std::array<json, kTierCount> rows;
  for (auto& r : rows) r = json::array();
  const bool bucketed = pts.size() > opts.max_points;
  auto bucket = [&](std::size_t k) {
    return std::size_t(std::clamp(since(pts[k].t_ns) / width, 0.0, double(nb)));
  };
  for (std::size_t i = 0, j; i < pts.size(); i = j) {
    j = i + 1;
    if (bucketed)
      while (j < pts.size() && bucket(j) == bucket(i)) ++j;
    times.push_back(since(pts[i].t_ns) * 1e-9);
    for (int t = 0; t < kTierCount; ++t) {
      std::size_t best = i;
      std::uint64_t best_total = 0;
      for (std::size_t k = i; k < j; ++k) {
        std::uint64_t tot = 0;
        for (int kind = 0; kind < kKindCount; ++kind) tot += pts[k].bytes[t][kind];
        if (k == i || tot > best_total) {
          best_total = tot;
          best = k;
        }
      }
      json r = json::array();
      for (int kind = 0; kind < kKindCount; ++kind) r.push_back(pts[best].bytes[t][kind]);
      rows[t].push_back(std::move(r));
    }
  }
  json tiers = json::array();
  for (int t = 0; t < kTierCount; ++t)
    tiers.push_back({{"name", tiering::to_string(tiering::Tier(t))},
                     {"present", tr.present[t]},
                     {"capacity", tr.capacity[t]},
                     {"rows", rows[t]}});
  json markers = json::array();
  for (const tiering::MemEvent& e : tr.events)
    if (e.type == tiering::EventType::marker)
      markers.push_back({{"t", since(e.t_ns) * 1e-9}, {"step", e.step}, {"phase", to_string(e.phase)}});
  json kinds = json::array();
  for (int k = 0; k < kKindCount; ++k) kinds.push_back(tiering::to_string(tiering::Kind(k)));
  std::string title = opts.title;
  if (title.empty()) {
    std::size_t slash = tr.path.find_last_of('/');
    title = slash == std::string::npos ? tr.path : tr.path.substr(slash + 1);
  }
  json data = {{"title", title},
               {"backend", "backend " + tr.backend + " (" + tr.device + ")"},
               {"end", since(t_end) * 1e-9},
               {"first_step", sum.first_step},
               {"kinds", kinds},
               {"t", times},
               {"tiers", tiers},
               {"markers", markers},
               {"summary", summary_json(sum)}};
  std::string page = kPage;
  const std::string slot = "DATA_JSON";
  page.replace(page.find(slot), slot.size(), script_safe(data.dump()));
  return page;
}

}  // namespace strata::memprof
