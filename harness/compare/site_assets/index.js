
(function () {
  var body = document.querySelector('#runs tbody'), rows = Array.prototype.slice.call(body.rows);
  var filters = Array.prototype.slice.call(document.querySelectorAll('select[data-filter]'));
  var search = document.getElementById('search'), figure = document.getElementById('figure');
  var state = {sort: null, dir: 1};
  function value(row, col) {
    var cell = row.cells[col], v = cell.getAttribute('data-v');
    if (v !== null && v !== '' && !isNaN(Number(v))) return Number(v);
    return v === '' ? null : cell.textContent.trim().toLowerCase();
  }
  function apply() {
    var shown = 0, text = search.value.trim().toLowerCase();
    rows.forEach(function (row) {
      var ok = filters.every(function (f) { return !f.value || row.getAttribute('data-' + f.getAttribute('data-filter')) === f.value; });
      if (ok && text) ok = row.textContent.toLowerCase().indexOf(text) >= 0;
      row.hidden = !ok; if (ok) shown++;
    });
    document.getElementById('count').textContent = shown + ' of ' + rows.length + ' runs shown';
    var hash = filters.filter(function (f) { return f.value; }).map(function (f) {
      return f.getAttribute('data-filter') + '=' + encodeURIComponent(f.value); });
    if (figure.value) hash.push('figure=' + encodeURIComponent(figure.value));
    if (state.sort !== null) hash.push('sort=' + state.sort + (state.dir < 0 ? '-' : ''));
    history.replaceState(null, '', hash.length ? '#' + hash.join('&') : location.pathname);
  }
  function sortBy(col, dir) {
    state.sort = col; state.dir = dir;
    document.querySelectorAll('#runs th[data-col]').forEach(function (th) {
      th.setAttribute('aria-sort', Number(th.getAttribute('data-col')) === col ? (dir > 0 ? 'ascending' : 'descending') : 'none'); });
    rows.sort(function (a, b) {
      var x = value(a, col), y = value(b, col);
      if (x === null && y === null) return 0; if (x === null) return 1; if (y === null) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    apply();
  }
  function showFigure() {
    var name = figure.value, col = rows.length ? rows[0].cells.length - 1 : 0;
    var factor = name ? Number(figure.options[figure.selectedIndex].getAttribute('data-factor')) : 1;
    document.getElementById('figure-head').textContent = name ? figure.options[figure.selectedIndex].text : 'figure';
    rows.forEach(function (row) {
      var figures = JSON.parse(row.getAttribute('data-figures') || '{}'), cell = row.cells[col];
      var v = name in figures ? figures[name] : null;
      if (v !== null) v = v * factor;
      cell.setAttribute('data-v', v === null ? '' : String(v));
      cell.textContent = v === null ? '-' : (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3)
        : Number(v.toPrecision(5)).toLocaleString('en-US', {maximumFractionDigits: 6});
    });
  }
  document.querySelectorAll('#runs th[data-col]').forEach(function (th) {
    th.addEventListener('click', function () {
      var col = Number(th.getAttribute('data-col'));
      sortBy(col, state.sort === col ? -state.dir : 1);
    });
  });
  filters.forEach(function (f) { f.addEventListener('change', apply); });
  search.addEventListener('input', apply);
  figure.addEventListener('change', function () { showFigure(); if (state.sort !== null) sortBy(state.sort, state.dir); else apply(); });
  document.getElementById('compare').addEventListener('click', function () {
    var ids = Array.prototype.slice.call(document.querySelectorAll('#runs input[type=checkbox]:checked'))
      .map(function (box) { return encodeURIComponent(box.value); });
    if (ids.length < 2) { document.getElementById('compare-note').textContent = 'tick two or more runs first'; return; }
    location.href = 'compare.html#' + ids.join(',');
  });
  // A view is kept in the address (#status=failed&figure=offline.samples_per_second&sort=9-) to share or bookmark.
  location.hash.replace(/^#/, '').split('&').forEach(function (part) {
    var kv = part.split('='), key = kv[0], val = decodeURIComponent(kv.slice(1).join('='));
    var f = filters.filter(function (x) { return x.getAttribute('data-filter') === key; })[0];
    if (f) f.value = val;
    if (key === 'figure') { figure.value = val; }
  });
  showFigure();
  var sort = /(?:^#|&)sort=(\d+)(-?)/.exec(location.hash);
  if (sort) sortBy(Number(sort[1]), sort[2] ? -1 : 1); else apply();
})();
