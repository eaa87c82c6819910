// The script of `trainwell report --watch`'s page (trainwell/report/watch_page.py tells what it does and why).
// Hand-written SVG, no library, nothing fetched but /data from this server.
(function () {
  'use strict';
  var COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
                '#bcbd22', '#17becf'];
  var W = 600, H = 300, L = 62, R = 12, T = 12, B = 36, SVG = 'http://www.w3.org/2000/svg';
  var AXES = {step: 'step', epoch: 'epoch', tokens: 'input tokens seen', time: 'wall time since the start (s)'};
  var SYSTEM = {cpu_percent: 'CPU % (process)', rss_bytes: 'process memory (bytes)',
                gpu_memory_bytes: 'GPU memory allocated (bytes)', gpu_reserved_bytes: 'GPU memory reserved (bytes)',
                gpu_util_percent: 'GPU utilisation %'};
  var version = -1, last = null, offset = 0, clipId = 0;
  var view = {x: null, smoothing: null, hidden: {}, log: {}, zoomX: {}, zoomY: {}};
  var pointer = null, dragging = false, stale = false;  // a redraw waits for a drag's end; hover survives one
  var drawn = {};  // figure key -> what its chart drew (for hover and CSV)
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
  function clock(seconds) {
    if (seconds === null || seconds === undefined || isNaN(seconds)) { return ''; }
    var s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
    return (h ? h + 'h' : '') + (h || m ? m + 'm' : '') + (s % 60) + 's';
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
  // TensorBoard's smoothing: an exponential moving average, debiased so that the start is not pulled to 0.
  function smooth(values, weight) {
    var out = [], avg = 0, norm = 0;
    values.forEach(function (v) {
      if (v === null || !isFinite(v)) { out.push(out.length ? out[out.length - 1] : null); return; }
      avg = weight * avg + (1 - weight) * v; norm = weight * norm + (1 - weight);
      out.push(avg / norm);
    });
    return out;
  }
  function autoWeight(points) { var span = points / 20; return span < 2 ? 0 : 1 - 1 / span; }
  // x of `step` on a run's axis `kind` ([step, x] pairs in step order), interpolated; null outside it
  function mapper(run, kind) {
    if (kind === 'step') { return function (s) { return s; }; }
    var pairs = run.axes && run.axes[kind];
    if (!pairs || !pairs.length) { return null; }
    return function (s) {
      var lo = 0, hi = pairs.length - 1;
      if (s < pairs[0][0] || s > pairs[hi][0]) { return null; }
      while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (pairs[mid][0] <= s) { lo = mid; } else { hi = mid; } }
      var a = pairs[lo], b = pairs[hi];
      return b[0] === a[0] ? a[1] : a[1] + (b[1] - a[1]) * (s - a[0]) / (b[0] - a[0]);
    };
  }
  function runColor(figure, s, runs) { return COLORS[(runs > 1 ? s.run : figure.series.indexOf(s)) % 10]; }
  function weightNow() {
    if (view.smoothing !== null) { return view.smoothing; }
    if (last && last.smoothing !== null && last.smoothing !== undefined) { return last.smoothing; }
    var most = 0;
    (last ? last.figures : []).forEach(function (f) {
      f.series.forEach(function (s) { if (s.key === 'loss') { most = Math.max(most, s.points.length); } });
    });
    return Math.round(autoWeight(most) * 100) / 100;
  }

  // The series a chart draws: shown runs only, x on the chosen axis, smoothed where the figure smooths.
  function lines(figure, kind) {
    var weight = weightNow(), out = [];
    figure.series.forEach(function (s) {
      if (view.hidden[s.run]) { return; }
      var run = last.runs[s.run], toX = figure.system ? function (t) { return t; } : mapper(run, kind);
      if (!toX) { return; }
      var xs = [], ys = [], steps = [];
      s.points.forEach(function (p) {
        var x = toX(p[0]);
        if (x !== null) { xs.push(x); ys.push(p[1]); steps.push(figure.system ? null : p[0]); }
      });
      var sm = s.smooth && weight > 0 && ys.length >= 3 ? smooth(ys, weight) : null;
      out.push({s: s, xs: xs, ys: ys, sm: sm, steps: steps, run: run});
    });
    return out;
  }
  function extent(values) {
    var lo = Infinity, hi = -Infinity;
    values.forEach(function (v) { if (v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    return lo <= hi ? [lo, hi] : null;
  }

  function chart(figure, kind, runs) {
    var key = figure.key, log = view.log[key] !== undefined ? view.log[key] : figure.log;
    var box = node('figure', {'data-key': key}), cap = node('figcaption');
    cap.appendChild(node('span', {'class': 'title'}, figure.title + (log ? ' (log scale)' : '')));
    var toggle = node('button', {'class': 'log', type: 'button'}, log ? 'linear' : 'log');
    toggle.addEventListener('click', function () { view.log[key] = !log; redraw(); });
    var csv = node('button', {'class': 'csv', type: 'button'}, 'CSV');
    csv.addEventListener('click', function () { download(key); });
    cap.appendChild(toggle); cap.appendChild(csv);
    box.appendChild(cap);
    var svg = node('svg', {viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'data-xkind': kind}, null, true);
    var drawnLines = lines(figure, kind), count = 0;
    drawnLines.forEach(function (d) { count += d.xs.length; });
    svg.setAttribute('data-points', String(count));
    box.appendChild(svg);
    var f = log ? function (v) { return v > 0 ? Math.log10(v) : null; } : function (v) { return v; };
    var zk = figure.system && kind !== 'time' ? 'sys' : kind;  // charts on the same x zoom together
    var xr = view.zoomX[zk] || extent([].concat.apply([], drawnLines.map(function (d) { return d.xs; })));
    if (!xr) { return box; }
    var x0 = xr[0], x1 = xr[1] === xr[0] ? xr[0] + 1 : xr[1], visible = [];
    drawnLines.forEach(function (d) {
      d.xs.forEach(function (x, i) { if (x >= x0 && x <= x1) { visible.push(f(d.ys[i])); } });
    });
    var yr = view.zoomY[key] ? view.zoomY[key].map(f) : extent(visible);
    if (!yr) { yr = [0, 1]; }
    var y0 = yr[0], y1 = yr[1];
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    if (!view.zoomY[key]) { var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad; }
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return H - B - (f(v) - y0) / (y1 - y0) * (H - T - B); }
    svg.setAttribute('data-x0', String(x0)); svg.setAttribute('data-x1', String(x1));
    svg.setAttribute('data-y0', String(y0)); svg.setAttribute('data-y1', String(y1));
    ticks(x0, x1, 6).forEach(function (v) {
      svg.appendChild(node('line', {x1: X(v), x2: X(v), y1: T, y2: H - B, stroke: '#eee'}, null, true));
      svg.appendChild(node('text', {x: X(v), y: H - B + 14, 'text-anchor': 'middle'}, fmt(v), true));
    });
    (log ? logTicks(y0, y1) : ticks(y0, y1, 5)).forEach(function (v) {
      svg.appendChild(node('line', {x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: '#eee'}, null, true));
      svg.appendChild(node('text', {x: L - 4, y: Y(v) + 4, 'text-anchor': 'end'}, fmt(v), true));
    });
    svg.appendChild(node('text', {x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle'},
                         figure.system ? AXES.time : AXES[kind], true));
    var clip = 'clip' + (clipId += 1), defs = node('defs', {}, null, true), rect = node('clipPath', {id: clip}, null, true);
    rect.appendChild(node('rect', {x: L, y: T, width: W - L - R, height: H - T - B}, null, true));
    defs.appendChild(rect); svg.appendChild(defs);
    var plot = node('g', {'clip-path': 'url(#' + clip + ')'}, null, true);
    svg.appendChild(plot);
    (figure.marks || []).forEach(function (m) {
      var toX = mapper(last.runs[m.run], kind), x = toX ? toX(m.x) : null;
      if (view.hidden[m.run] || x === null) { return; }
      var line = node('line', {x1: X(x), x2: X(x), y1: T, y2: H - B, stroke: '#999', 'stroke-dasharray': '4 3'},
                      null, true);
      line.appendChild(node('title', {}, (runs > 1 ? last.runs[m.run].name + ': ' : '') + m.label, true));
      plot.appendChild(line);
    });
    var legend = node('div', {'class': 'legend'});
    drawnLines.forEach(function (d) {
      var color = runColor(figure, d.s, runs), dashed = d.s.key.indexOf('eval_') === 0 && runs > 1;
      function curve(values, label, faint) {
        var parts = [], pieces = [];
        d.xs.forEach(function (x, i) {
          var v = values[i];
          if (v === null || (log && v <= 0)) { if (parts.length) { pieces.push(parts); parts = []; } }
          else { parts.push(X(x).toFixed(1) + ',' + Y(v).toFixed(1)); }
        });
        if (parts.length) { pieces.push(parts); }
        var group = node('g', {'data-run': d.s.run, 'data-series': label, 'data-points': values.length,
                               'data-last': values.length ? String(values[values.length - 1]) : ''}, null, true);
        pieces.forEach(function (pts) {
          var attrs = {points: pts.join(' '), fill: 'none', stroke: color, 'stroke-width': faint ? 1 : 1.6,
                       'stroke-opacity': faint ? 0.3 : 1};
          if (dashed) { attrs['stroke-dasharray'] = '6 3'; }
          group.appendChild(node('polyline', attrs, null, true));
          if (pts.length === 1) {
            var xy = pts[0].split(',');
            group.appendChild(node('circle', {cx: xy[0], cy: xy[1], r: 2.5, fill: color}, null, true));
          }
        });
        plot.appendChild(group);
      }
      curve(d.ys, d.s.label, d.sm !== null);
      if (d.sm) { curve(d.sm, d.s.label + ' (smoothed)', false); }
      var item = node('span');
      item.appendChild(node('span', {'class': 'swatch', style: 'background:' + color}));
      item.appendChild(document.createTextNode((runs > 1 ? d.run.name + ': ' : '') + d.s.label));
      legend.appendChild(item);
    });
    var tip = node('div', {'class': 'tip'});
    box.appendChild(tip);
    box.appendChild(legend);
    drawn[key] = {lines: drawnLines, kind: figure.system ? 'time' : kind, x0: x0, x1: x1, y0: y0, y1: y1, log: log};
    interact(svg, key, zk, tip, {X: X, x0: x0, x1: x1, y0: y0, y1: y1, log: log});
    return box;
  }

  // pointer position -> data coordinates of a chart
  function at(svg, event, r) {
    var box = svg.getBoundingClientRect(), px = (event.clientX - box.left) / box.width * W;
    var py = (event.clientY - box.top) / box.height * H;
    var x = r.x0 + (px - L) / (W - L - R) * (r.x1 - r.x0), y = r.y0 + (H - B - py) / (H - T - B) * (r.y1 - r.y0);
    return {px: px, py: py, x: x, y: r.log ? Math.pow(10, y) : y};
  }
  function nearest(xs, x) {
    var best = -1, gap = Infinity;
    xs.forEach(function (v, i) { var d = Math.abs(v - x); if (d < gap) { gap = d; best = i; } });
    return best;
  }
  function interact(svg, key, zoomKey, tip, r) {
    var start = null, band = null, cursor = node('line', {y1: T, y2: H - B, stroke: '#888', visibility: 'hidden'},
                                                    null, true);
    svg.appendChild(cursor);
    svg.addEventListener('mousemove', function (event) {
      var p = at(svg, event, r);
      if (start) {
        if (!band) { band = node('rect', {fill: 'rgba(31,119,180,0.15)', stroke: '#1f77b4'}, null, true); svg.appendChild(band); }
        band.setAttribute('x', Math.min(start.px, p.px)); band.setAttribute('width', Math.abs(p.px - start.px));
        band.setAttribute('y', Math.min(start.py, p.py)); band.setAttribute('height', Math.abs(p.py - start.py));
      }
      hover(key, p.x, tip, event);
      pointer = {key: key, x: p.x, clientX: event.clientX, clientY: event.clientY, px: p.px};
      cursor.setAttribute('x1', p.px); cursor.setAttribute('x2', p.px); cursor.setAttribute('visibility', 'visible');
    });
    svg.addEventListener('mouseleave', function () {
      pointer = null;
      tip.style.display = 'none'; cursor.setAttribute('visibility', 'hidden');
    });
    svg.addEventListener('mousedown', function (event) {
      start = at(svg, event, r); dragging = true; event.preventDefault();
    });
    svg.addEventListener('mouseup', function (event) {
      dragging = false;
      if (!start) { if (stale) { redraw(); } return; }
      var p = at(svg, event, r), a = start;
      start = null;
      if (band) { band.remove(); band = null; }
      if (Math.abs(p.px - a.px) > 5) { view.zoomX[zoomKey] = [Math.min(a.x, p.x), Math.max(a.x, p.x)]; }
      if (Math.abs(p.py - a.py) > 5) { view.zoomY[key] = [Math.min(a.y, p.y), Math.max(a.y, p.y)]; }
      if (stale || Math.abs(p.px - a.px) > 5 || Math.abs(p.py - a.py) > 5) { redraw(); }
    });
    svg.addEventListener('wheel', function (event) {
      event.preventDefault();
      var p = at(svg, event, r), k = event.deltaY > 0 ? 1.25 : 0.8;
      view.zoomX[zoomKey] = [p.x - (p.x - r.x0) * k, p.x + (r.x1 - p.x) * k];
      redraw();
    }, {passive: false});
    svg.addEventListener('dblclick', function () { delete view.zoomX[zoomKey]; delete view.zoomY[key]; redraw(); });
  }
  function hover(key, x, tip, event) {
    var d = drawn[key], rows = [];
    if (!d) { return; }
    d.lines.forEach(function (line) {
      var i = nearest(line.xs, x);
      if (i < 0) { return; }
      var step = line.steps[i], toTime = step !== null ? mapper(line.run, 'time') : null;
      var when = d.kind === 'time' ? line.xs[i] : toTime ? toTime(step) : null;
      rows.push((last.runs.length > 1 ? line.run.name + ': ' : '') + line.s.label + ' = ' + fmt(line.ys[i]) +
                (line.sm ? ' (smoothed ' + fmt(line.sm[i]) + ')' : '') + (step !== null ? ', step ' + step : '') +
                (d.kind !== 'step' && d.kind !== 'time' ? ', ' + d.kind + ' ' + fmt(line.xs[i]) : '') +
                (when !== null && when !== undefined ? ', at ' + clock(when) : ''));
    });
    tip.replaceChildren.apply(tip, rows.map(function (t) { return node('div', {}, t); }));
    tip.style.display = rows.length ? 'block' : 'none';
    var box = tip.parentNode.getBoundingClientRect();
    tip.style.left = Math.min(event.clientX - box.left + 12, box.width * 0.45) + 'px';
    tip.style.top = Math.max(event.clientY - box.top - 10, 0) + 'px';
  }

  // The chart's data as CSV: one row per point of each shown series, x on the chosen axis.
  function csv(key) {
    var d = drawn[key];
    if (!d) { return ''; }
    var quote = function (v) { v = String(v); return /[",\n\r]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; };
    var out = [['run', 'series', 'step', d.kind === 'step' ? 'x' : d.kind, 'value', 'smoothed'].join(',')];
    d.lines.forEach(function (line) {
      line.xs.forEach(function (x, i) {
        out.push([quote(line.run.name), quote(line.s.label), line.steps[i] === null ? '' : line.steps[i], x,
                  line.ys[i] === null ? '' : line.ys[i], line.sm ? line.sm[i] : ''].join(','));
      });
    });
    return out.join('\n') + '\n';
  }
  function download(key) {
    var url = URL.createObjectURL(new Blob([csv(key)], {type: 'text/csv'}));
    var a = node('a', {href: url, download: key.replace(/[^A-Za-z0-9_.-]/g, '_') + '.csv'});
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 1000);
  }
  window.trainwellCsv = csv;

  function systemFigures() {
    var out = [];
    Object.keys(SYSTEM).forEach(function (metric) {
      var series = [];
      last.runs.forEach(function (run, i) {
        var points = run.system && run.system[metric];
        if (points && points.length) {
          series.push({run: i, key: metric, label: metric, points: points, smooth: false});
        }
      });
      if (series.length) {
        out.push({key: 'system_' + metric, title: SYSTEM[metric], series: series, marks: [], log: false, system: true});
      }
    });
    return out;
  }

  function stateText(r) {
    if (r.error) { return r.error; }
    if (r.step === undefined) { return ''; }
    if (r.finished) { return r.step >= r.max_steps ? 'finished' : 'stopped at step ' + r.step + ' (train() returned early)'; }
    return r.state_text || 'training, or stopped before its end';
  }
  function table(runs) {
    var t = node('table'), head = node('tr');
    ['show', 'run', 'step', 'sessions', 'train loss', 'validation loss', 'last log', 'state'].forEach(function (h) {
      head.appendChild(node('th', {}, h));
    });
    t.appendChild(head);
    runs.forEach(function (r, i) {
      var row = node('tr', {'data-state': r.state || ''}), pick = node('td'), name = node('td');
      var box = node('input', {type: 'checkbox', 'class': 'show', 'data-run': i});
      box.checked = !view.hidden[i];
      box.addEventListener('change', function () { view.hidden[i] = !box.checked; redraw(); });
      pick.appendChild(box);
      row.appendChild(pick);
      name.appendChild(node('span', {'class': 'swatch', style: 'background:' + COLORS[i % 10]}));
      name.appendChild(document.createTextNode(r.name));
      row.appendChild(name);
      var step = r.step === undefined ? '' : r.step + ' / ' + r.max_steps;
      [step, r.sessions, fmt(r.loss), fmt(r.eval_loss)].forEach(function (v) {
        row.appendChild(node('td', {'class': 'num'}, v === undefined ? '' : v));
      });
      row.appendChild(node('td', {'class': 'num age', 'data-time': r.last_log || ''}, ''));
      var cell = node('td', {'class': r.error || r.state === 'stopped' || r.state === 'ended' ? 'note' : ''},
                      stateText(r));
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

  function controls() {
    var kinds = ['step'].concat(['epoch', 'tokens', 'time'].filter(function (k) {
      return last.runs.some(function (r) { return r.axes && r.axes[k] && r.axes[k].length; });
    }));
    if (view.x === null) { view.x = last.x || 'step'; }
    var kind = kinds.indexOf(view.x) >= 0 ? view.x : 'step';
    var select = document.getElementById('xaxis');
    select.replaceChildren.apply(select, kinds.map(function (k) { return node('option', {value: k}, AXES[k]); }));
    select.value = kind;
    var weight = weightNow(), slider = document.getElementById('smoothing');
    slider.value = String(weight);
    document.getElementById('weight').textContent = weight.toFixed(2);
    return kind;
  }
  function redraw() {
    if (!last) { return; }
    if (dragging) { stale = true; return; }  // new data mid-drag: drawn at the drag's end
    stale = false;
    var kind = controls(), runs = last.runs.length;
    drawn = {};
    var plots = document.getElementById('plots'), system = document.getElementById('system');
    plots.replaceChildren.apply(plots, last.figures.map(function (fig) { return chart(fig, kind, runs); }));
    system.replaceChildren.apply(system, systemFigures().map(function (fig) { return chart(fig, kind, runs); }));
    document.getElementById('system-title').style.display = system.children.length ? 'block' : 'none';
    document.body.setAttribute('data-x', kind);
    var again = pointer && document.querySelector('figure[data-key="' + pointer.key + '"]');
    if (again && drawn[pointer.key]) {  // the values at the pointer stay shown across a redraw
      hover(pointer.key, pointer.x, again.querySelector('.tip'), pointer);
      var line = again.querySelector('svg > line[visibility]');
      if (line) { line.setAttribute('x1', pointer.px); line.setAttribute('x2', pointer.px);
                  line.setAttribute('visibility', 'visible'); }
    }
  }
  function render(data) {
    if (data.unchanged) { ages(data.time); return; }
    version = data.version;
    last = data;
    var names = data.runs.map(function (r) { return r.name; });
    document.title = 'trainwell live: ' + names.join(', ');
    document.getElementById('title').textContent = 'trainwell live: ' + names.join(', ');
    document.getElementById('runs').replaceChildren(table(data.runs));
    redraw();
    ages(data.time);
    document.body.setAttribute('data-version', String(version));
  }

  document.getElementById('smoothing').addEventListener('input', function (event) {
    view.smoothing = parseFloat(event.target.value); redraw();
  });
  document.getElementById('xaxis').addEventListener('change', function (event) {
    view.x = event.target.value; redraw();
  });
  window.addEventListener('mouseup', function () {  // a drag that ended outside the chart: no zoom, charts redrawn
    if (dragging) { dragging = false; redraw(); }
  });
  document.getElementById('reset').addEventListener('click', function () { view.zoomX = {}; view.zoomY = {}; redraw(); });

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
