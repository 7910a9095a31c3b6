
(function () {
  var D = JSON.parse(document.getElementById('site-data').textContent);
  var out = document.getElementById('comparison');
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) { node.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
    return node;
  }
  function table(headers, rows) {
    return el('table', {}, [el('thead', {}, [el('tr', {}, headers.map(function (h) { return el('th', {}, [h]); }))]),
      el('tbody', {}, rows.map(function (r) { return el('tr', {}, r.map(function (c) {
        return c instanceof Node ? c : el('td', typeof c === 'number' ? {class: 'n'} : {}, [c === null || c === undefined ? '-' : String(c)]); })); }))]);
  }
  function fmt(v) {
    if (v === undefined || v === null) return '-';
    if (v !== 0 && Math.abs(v) < 1e-3) return v.toExponential(3);
    return Number(v.toPrecision(5)).toLocaleString('en-US', {maximumFractionDigits: 6});
  }
  function same(a, b) { return JSON.stringify(a === undefined ? null : a) === JSON.stringify(b === undefined ? null : b); }
  var ids = decodeURIComponent(location.hash.replace(/^#/, '')).split(',').filter(Boolean);
  var runs = [], missing = [];
  ids.forEach(function (id) { if (D.runs[id]) runs.push(D.runs[id]); else missing.push(id); });
  if (missing.length) out.appendChild(el('p', {class: 'failed'}, ['not in this site: ' + missing.join(', ')]));
  if (runs.length < 2) {
    out.appendChild(el('p', {}, ['Tick two or more runs on the ', el('a', {href: 'index.html'}, ['run list']),
      ' and press "compare ticked runs" (or open compare.html#RUN_ID,RUN_ID).']));
    return;
  }
  var names = runs.map(function (r, i) { return String.fromCharCode(65 + i); });
  document.title = 'Comparison of ' + runs.length + ' runs';
  out.appendChild(table(['', 'run', 'model', 'backend', 'scenario', 'mode', 'status', 'system', 'started'],
    runs.map(function (r, i) { return [names[i], el('td', {}, [el('a', {href: r.page}, [r.id])]), r.model, r.backend,
      r.scenario, r.mode, el('td', {class: r.status}, [r.status]), r.system, r.started]; })));
  // The gates' rules (harness/compare/comparability.py): same system and framework versions, else refused.
  var diffs = [];
  runs.slice(1).forEach(function (r, i) {
    var a = D.fingerprints[runs[0].fp], b = D.fingerprints[r.fp];
    Object.keys(Object.assign({}, a, b)).sort().forEach(function (k) {
      if (!same(a[k], b[k])) diffs.push(names[i + 1] + ' vs A: ' + k + ': ' + JSON.stringify(a[k]) + ' vs ' + JSON.stringify(b[k]));
    });
  });
  var verdict = el('div', {id: 'comparability'}, []);
  if (!diffs.length) {
    verdict.appendChild(el('p', {class: 'ok'}, ['Comparable: the same system and framework versions.']));
  } else {
    verdict.appendChild(el('p', {class: 'failed'}, ['Not comparable: a gate refuses these runs unless --allow-different-systems.']));
    verdict.appendChild(el('ul', {}, diffs.map(function (d) { return el('li', {}, [d]); })));
  }
  var notes = [];
  runs.slice(1).forEach(function (r, i) {
    var differ = ['model', 'backend', 'scenario'].filter(function (k) { return r[k] !== runs[0][k]; });
    if (!same(r.harness, runs[0].harness)) differ.push('harness settings');
    if (differ.length) notes.push(names[i + 1] + ' is another configuration than A (' + differ.join(', ') + '): a gate matches runs by model, backend, scenario and settings.');
    if (!same(r.loadgen, runs[0].loadgen)) notes.push(names[i + 1] + ' ran with other LoadGen settings than A (see below).');
  });
  runs.forEach(function (r, i) { if (r.status !== 'ok') notes.push(names[i] + ' did not finish (' + r.status + '): a gate fails a failed candidate and leaves out a failed baseline.'); });
  notes.forEach(function (n) { verdict.appendChild(el('p', {class: 'note'}, [n])); });
  out.appendChild(el('h2', {}, ['Comparability']));
  out.appendChild(verdict);
  var figures = {};
  runs.forEach(function (r) { Object.keys(r.figures).forEach(function (k) { figures[k] = 1; }); });
  var headers = ['figure', 'A'];
  names.slice(1).forEach(function (n) { headers.push(n, n + ' vs A'); });
  headers.push('better');
  var rows = Object.keys(figures).sort().map(function (k) {
    var unit = D.units[k] || ['', 1], a = runs[0].figures[k], row = [D.labels[k], fmt(a === undefined ? a : a * unit[1])];
    runs.slice(1).forEach(function (r) {
      var b = r.figures[k], change = null, cls = {};
      row.push(fmt(b === undefined ? b : b * unit[1]));
      if (a !== undefined && b !== undefined && a !== 0) {
        change = 100 * (b - a) / Math.abs(a);
        if (Math.abs(change) >= 0.005) cls = {class: (change > 0) === D.higher[k] ? 'good' : 'bad'};
      }
      row.push(el('td', cls, [change === null ? '-' : (change >= 0 ? '+' : '') + change.toFixed(2) + '%']));
    });
    row.push(D.higher[k] ? 'higher' : 'lower');
    return row;
  });
  out.appendChild(el('h2', {}, ['Figures']));
  out.appendChild(table(headers, rows));
  var keys = {};
  runs.forEach(function (r) { Object.keys(r.settings).forEach(function (k) { keys[k] = 1; }); });
  var differing = Object.keys(keys).sort().filter(function (k) {
    return runs.some(function (r) { return !same(r.settings[k], runs[0].settings[k]); }); });
  out.appendChild(el('h2', {}, ['Settings and manifests that differ']));
  out.appendChild(differing.length ? table(['key'].concat(names), differing.map(function (k) {
    return [k].concat(runs.map(function (r) { return r.settings[k] === undefined ? '-' : String(r.settings[k]); })); }))
    : el('p', {class: 'note'}, ['none: the same settings and manifests']));
  var plots = runs.filter(function (r) { return r.latency; });
  if (plots.length) {
    out.appendChild(el('h2', {}, ['Latency percentiles']));
    out.appendChild(el('div', {class: 'side'}, plots.map(function (r) {
      return el('figure', {}, [el('img', {src: r.latency, alt: 'latency percentiles of ' + r.id}),
        el('figcaption', {}, [names[runs.indexOf(r)] + ': ' + r.id])]); })));
  }
})();
