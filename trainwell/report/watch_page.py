"""The live page of ``trainwell report --watch``: one HTML file with its script, drawing SVG charts itself.

Owns the markup, the style and the script. The script asks ``/data`` every second (``?since=VERSION``: the server
answers ``unchanged`` until a run's files change), then redraws: a table with one row per run (step, sessions,
last losses, how long ago it last logged, whether its ``train()`` returned) and one chart per figure of the
written report (``trainwell.report.plots.plot_groups``), every run on each chart in its own colour, the train loss
smoothed over its faint raw curve, a dashed line at each resume point, a log-scale y where the server says so.
Nothing is fetched from elsewhere (the server's Content-Security-Policy allows this script, by its nonce, and
requests to itself only); each data request carries the page's token (from its address), which the server
requires. The server's ``error`` (the figures could not be built) shows above the table, a run's ``error`` and
``note`` in its row. Every name from a run folder is set as text (``textContent``), never parsed as markup.
After each redraw ``document.body`` carries ``data-version``, every chart its figure's ``data-key`` and ``data-points``
(its number of points), and every curve a ``g`` with ``data-run``, ``data-series`` and ``data-points``: the browser
test reads them.
"""

from __future__ import annotations

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1800px;margin:1.5em auto;padding:0 1em}
body{color:#222}
h1{font-size:1.4em;overflow-wrap:anywhere}.note{color:#a60}.muted{color:#777}
.scroll{overflow-x:auto;max-width:100%;margin:1em 0}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{white-space:nowrap;text-align:right}td{overflow-wrap:break-word}
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.4em;border-radius:2px}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,460px),1fr));gap:.5em 1em}
figure{margin:0;min-width:0}figcaption{font-weight:600;margin:.6em 0 .2em}
svg{width:100%;height:auto;display:block;border:1px solid #eee}svg text{font-size:11px;fill:#555}
.legend{font-size:.85em;color:#444;overflow-wrap:anywhere}.legend span{margin-right:1em;white-space:nowrap}
"""

_SCRIPT = r"""
(function () {
  'use strict';
  var COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
                '#bcbd22', '#17becf'];
  var W = 600, H = 300, L = 62, R = 12, T = 12, B = 36, SVG = 'http://www.w3.org/2000/svg';
  var version = -1, last = null, offset = 0;
  var TOKEN = new URLSearchParams(window.location.search).get('token') || '';  // the server answers no one without

  function node(tag, attrs, text, svg) {
    var e = svg ? document.createElementNS(SVG, tag) : document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) { return ''; }
    if (typeof v !== 'number') { return String(v); }
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-4 || a >= 1e6)) { return v.toExponential(2).replace('e+', 'e'); }
    return String(Number(v.toPrecision(4)));
  }
  function ago(seconds) {
    if (seconds < 90) { return Math.max(0, Math.round(seconds)) + ' s ago'; }
    if (seconds < 5400) { return Math.round(seconds / 60) + ' min ago'; }
    return (seconds / 3600).toFixed(1) + ' h ago';
  }
  function ticks(lo, hi, n) {
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / n))), out = [];
    [1, 2, 5, 10].some(function (m) { if (span / (step * m) <= n) { step *= m; return true; } return false; });
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) { out.push(v); }
    return out;
  }
  function logTicks(a, b) {  // a, b: log10 of the range; 1-2-5 steps of each decade while they are few
    if (b - a < 1) { return ticks(Math.pow(10, a), Math.pow(10, b), 4); }
    var out = [], steps = b - a < 3 ? [1, 2, 5] : [1];
    for (var e = Math.floor(a); e <= Math.ceil(b); e++) {
      steps.forEach(function (m) {
        var v = m * Math.pow(10, e), l = Math.log10(v);
        if (l >= a && l <= b) { out.push(v); }
      });
    }
    return out;
  }
  function runColor(figure, s, runs) { return COLORS[(runs > 1 ? s.run : figure.series.indexOf(s)) % 10]; }

  function chart(figure, runs) {
    var box = node('figure', {'data-key': figure.key});
    var svg = node('svg', {viewBox: '0 0 ' + W + ' ' + H, role: 'img'}, null, true);
    box.appendChild(node('figcaption', {}, figure.title + (figure.log ? ' (log scale)' : '')));
    var xs = [], ys = [], count = 0;
    figure.series.forEach(function (s) {
      s.points.forEach(function (p) {
        count += 1;
        if (p[1] !== null && (!figure.log || p[1] > 0)) { xs.push(p[0]); ys.push(p[1]); }
      });
    });
    svg.setAttribute('data-points', String(count));
    if (!xs.length) { box.appendChild(svg); return box; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var f = figure.log ? function (v) { return Math.log10(v); } : function (v) { return v; };
    var y0 = f(Math.min.apply(null, ys)), y1 = f(Math.max.apply(null, ys));
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return H - B - (f(v) - y0) / (y1 - y0) * (H - T - B); }
    ticks(x0, x1, 6).forEach(function (v) {
      svg.appendChild(node('line', {x1: X(v), x2: X(v), y1: T, y2: H - B, stroke: '#eee'}, null, true));
      svg.appendChild(node('text', {x: X(v), y: H - B + 14, 'text-anchor': 'middle'}, fmt(v), true));
    });
    var yt = figure.log ? logTicks(y0, y1) : ticks(y0, y1, 5);
    yt.forEach(function (v) {
      svg.appendChild(node('line', {x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: '#eee'}, null, true));
      svg.appendChild(node('text', {x: L - 4, y: Y(v) + 4, 'text-anchor': 'end'}, fmt(v), true));
    });
    svg.appendChild(node('text', {x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle'}, 'step', true));
    figure.marks.forEach(function (m) {
      if (m.x < x0 || m.x > x1) { return; }
      var line = node('line', {x1: X(m.x), x2: X(m.x), y1: T, y2: H - B, stroke: '#999',
                               'stroke-dasharray': '4 3'}, null, true);
      line.appendChild(node('title', {}, (runs > 1 ? last.runs[m.run].name + ': ' : '') + m.label, true));
      svg.appendChild(line);
    });
    var legend = node('div', {'class': 'legend'});
    figure.series.forEach(function (s) {
      var color = runColor(figure, s, runs), parts = [], lines = [];
      s.points.forEach(function (p) {
        if (p[1] === null || (figure.log && p[1] <= 0)) { if (parts.length) { lines.push(parts); parts = []; } }
        else { parts.push(X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)); }
      });
      if (parts.length) { lines.push(parts); }
      var group = node('g', {'data-run': s.run, 'data-series': s.label, 'data-points': s.points.length}, null, true);
      lines.forEach(function (pts) {
        var attrs = {points: pts.join(' '), fill: 'none', stroke: color, 'stroke-width': s.faint ? 1 : 1.6,
                     'stroke-opacity': s.faint ? 0.3 : 1};
        if (s.key.indexOf('eval_') === 0 && runs > 1) { attrs['stroke-dasharray'] = '6 3'; }
        group.appendChild(node('polyline', attrs, null, true));
        if (pts.length === 1) {
          var xy = pts[0].split(',');
          group.appendChild(node('circle', {cx: xy[0], cy: xy[1], r: 2.5, fill: color}, null, true));
        }
      });
      svg.appendChild(group);
      if (!s.faint) {
        var item = node('span');
        item.appendChild(node('span', {'class': 'swatch', style: 'background:' + color}));
        item.appendChild(document.createTextNode((runs > 1 ? last.runs[s.run].name + ': ' : '') + s.label));
        legend.appendChild(item);
      }
    });
    box.appendChild(svg);
    box.appendChild(legend);
    return box;
  }

  function table(runs) {
    var t = node('table'), head = node('tr');
    ['run', 'step', 'sessions', 'train loss', 'validation loss', 'last log', 'state'].forEach(function (h) {
      head.appendChild(node('th', {}, h));
    });
    t.appendChild(head);
    runs.forEach(function (r, i) {
      var row = node('tr'), name = node('td');
      name.appendChild(node('span', {'class': 'swatch', style: 'background:' + COLORS[i % 10]}));
      name.appendChild(document.createTextNode(r.name));
      row.appendChild(name);
      var step = r.step === undefined ? '' : r.step + ' / ' + r.max_steps;
      [step, r.sessions, fmt(r.loss), fmt(r.eval_loss)].forEach(function (v) {
        row.appendChild(node('td', {'class': 'num'}, v === undefined ? '' : v));
      });
      row.appendChild(node('td', {'class': 'num age', 'data-time': r.last_log || ''}, ''));
      var state = r.error ? r.error : r.step === undefined ? '' : !r.finished ? 'training, or stopped before its end' :
        r.step >= r.max_steps ? 'finished' : 'stopped at step ' + r.step + ' (train() returned early)';
      var cell = node('td', {'class': r.error ? 'note' : ''}, state);
      if (r.note) { cell.appendChild(node('div', {'class': 'muted'}, r.note)); }
      row.appendChild(cell);
      t.appendChild(row);
    });
    return t;
  }

  function ages(serverTime) {
    offset = serverTime ? serverTime - Date.now() / 1000 : offset;
    document.querySelectorAll('td.age').forEach(function (cell) {
      var t = parseFloat(cell.getAttribute('data-time'));
      cell.textContent = isNaN(t) ? '' : ago(Date.now() / 1000 + offset - t);
    });
  }

  function render(data) {
    if (data.unchanged) { ages(data.time); return; }
    version = data.version;
    last = data;
    var names = data.runs.map(function (r) { return r.name; });
    document.title = 'trainwell live: ' + names.join(', ');
    document.getElementById('title').textContent = 'trainwell live: ' + names.join(', ');
    var runs = document.getElementById('runs');
    runs.replaceChildren(table(data.runs));
    var plots = document.getElementById('plots');
    plots.replaceChildren.apply(plots, data.figures.map(function (fig) { return chart(fig, data.runs.length); }));
    ages(data.time);
    document.body.setAttribute('data-version', String(version));
  }

  function poll() {
    var status = document.getElementById('status');
    fetch('data?since=' + version + '&token=' + encodeURIComponent(TOKEN), {cache: 'no-store'})
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.json(); })
      .then(function (data) { render(data); status.textContent = last && last.error ? last.error : ''; })
      .catch(function (err) {
        status.textContent = 'The server does not answer (' + err.message + '): is trainwell report --watch ' +
          'still running? The page keeps trying.';
      })
      .then(function () { setTimeout(poll, 1000); });
  }
  poll();
})();
"""


def page(nonce: str) -> str:
    """The page, its script allowed by ``nonce`` (the server's Content-Security-Policy names it)."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'><title>trainwell live</title>"
        f"<style>{_STYLE}</style></head><body><h1 id='title'>trainwell live</h1>"
        "<p class='muted'>Follows the runs' folders: a new log shows within about two seconds. "
        "Written by <code>trainwell report --watch</code>; nothing here changes a run.</p>"
        "<p id='status' class='note'></p><div id='runs' class='scroll'></div><div id='plots' class='plots'></div>"
        f"<script nonce='{nonce}'>{_SCRIPT}</script></body></html>"
    )


__all__ = ["page"]
