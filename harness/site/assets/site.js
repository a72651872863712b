// Sorting and filtering of the site's tables, in plain JavaScript (nothing fetched): a click on a heading sorts its
// column (numbers by each cell's data-v, else text), again reverses; the box above a table hides rows without all
// of its words.
(function () {
  "use strict";
  function key(row, col) {
    var cell = row.cells[col];
    if (!cell) { return ""; }
    var v = cell.getAttribute("data-v");
    return v !== null ? parseFloat(v) : cell.textContent.trim().toLowerCase();
  }
  function compare(a, b) {
    var na = typeof a === "number", nb = typeof b === "number";
    if (na && nb) { return a - b; }
    if (na !== nb) { return na ? -1 : 1; }
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function sortBy(table, col, th) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var descending = th.getAttribute("aria-sort") === "ascending";
    rows.sort(function (r1, r2) { var c = compare(key(r1, col), key(r2, col)); return descending ? -c : c; });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    rows.forEach(function (r) { body.appendChild(r); });
  }
  function filter(input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
      var text = r.textContent.toLowerCase();
      var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
      r.style.display = keep ? "" : "none";
      shown += keep ? 1 : 0;
    });
    var count = document.getElementById(table.id + "-count");
    if (count) { count.textContent = shown + " of " + table.tBodies[0].rows.length + " rows"; }
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
      if (!table.tHead) { return; }
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
        th.addEventListener("click", function () { sortBy(table, col, th); });
        th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sortBy(table, col, th); } });
      });
    });
    Array.prototype.forEach.call(document.querySelectorAll("input.filter"), function (input) {
      input.addEventListener("input", function () { filter(input); });
    });
  });
}());
