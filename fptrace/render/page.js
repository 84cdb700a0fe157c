// The report page's explorer (render/page.py inlines it into the page's script element): it reads
// the JSON blocks `fptrace-trace` (the trace) and `fptrace-data` (what each section offers,
// render/pagedata.py) and builds the token strip, the logit-lens heatmap (one HTML cell per
// layer and position, its exact values on hover or focus), the panels a token or a block
// opens, and each section's heatmaps. Keys: left/right move the selected token, up/down the
// selected block, Enter opens both panels, Escape closes them. No file, font or library is
// fetched.
(function () {
  "use strict";
  // the one DOM builder of the page's scripts: pagegraph.js, inlined after this one, uses it
  window.fptraceEl = el;
  var traceText = document.getElementById("fptrace-trace").textContent;
  var D = JSON.parse(document.getElementById("fptrace-data").textContent);
  var T = JSON.parse(traceText), G = T.lens_grid || [], P = T.lens_positions || [];
  var download = document.getElementById("download");
  if (download) {  // the trace's own JSON text, saved as a file (no request: a local blob)
    download.href = URL.createObjectURL(new Blob([traceText], { type: "application/json" }));
  }
  var root = document.getElementById("explore");
  if (!root || !G.length) { return; }
  var L1 = G.length, N = P.length;
  var sel = { pos: N - 1, row: L1 - 1 };
  var open = { token: false, block: false };

  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") { e.textContent = attrs[k]; } else { e.setAttribute(k, attrs[k]); }
    });
    (kids || []).forEach(function (c) { if (c) { e.appendChild(c); } });
    return e;
  }
  function num(v) {
    if (v === null || v === undefined) { return "n/a"; }
    if (typeof v !== "number") { return String(v); }
    return String(Number(v.toPrecision(6)));
  }
  function short(v) { return String(Number(v.toPrecision(3))); }
  var VIS = { " ": "\u2423", "\n": "\u21b5", "\t": "\u21e5", "\r": "\u240d" };
  function vis(s) {
    var out = "";
    for (var i = 0; i < (s || "").length; i++) { out += VIS[s[i]] || s[i]; }
    return out || "\u2205";
  }
  function rowName(k) { return k === 0 ? "embed" : "block " + (k - 1); }
  function tokenAt(j) { return T.tokens[P[j]]; }
  function tokenName(j) {
    var t = tokenAt(j);
    return "position " + P[j] + " \u201c" + vis(t.text) + "\u201d (id " + t.id + ")";
  }
  function sequential(v, top) {
    var x = top > 0 ? Math.max(0, Math.min(1, v / top)) : 0;
    return ["hsl(258, 55%, " + (97 - 62 * x) + "%)", x > 0.55 ? "#fff" : "#111"];
  }
  function diverging(v, top) {
    var x = top > 0 ? Math.max(-1, Math.min(1, v / top)) : 0;
    return ["hsl(" + (x >= 0 ? 4 : 214) + ", 70%, " + (97 - 50 * Math.abs(x)) + "%)",
            Math.abs(x) > 0.7 ? "#fff" : "#111"];
  }

  // the tooltip: one element, filled from the hovered or focused cell's data
  var tip = el("div", { id: "tip", role: "tooltip" });
  tip.hidden = true;
  document.body.appendChild(tip);
  function showTip(cell, x, y) {
    tip.textContent = cell.__tip();
    tip.hidden = false;
    if (x === undefined) {
      var r = cell.getBoundingClientRect();
      x = r.right + window.scrollX; y = r.bottom + window.scrollY;
    }
    // beside the pointer, kept inside the window
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var right = window.scrollX + document.documentElement.clientWidth - 4;
    var bottom = window.scrollY + document.documentElement.clientHeight - 4;
    var left = x + 12 + w > right ? Math.max(window.scrollX + 4, x - 12 - w) : x + 12;
    var top = y + 12 + h > bottom ? Math.max(window.scrollY + 4, y - 12 - h) : y + 12;
    tip.style.left = left + "px"; tip.style.top = top + "px";
  }
  function hideTip() { tip.hidden = true; }
  function tipped(cell, text) {
    cell.__tip = text;
    cell.addEventListener("mousemove", function (e) { showTip(cell, e.pageX, e.pageY); });
    cell.addEventListener("mouseleave", hideTip);
    cell.addEventListener("focus", function () { showTip(cell); });
    cell.addEventListener("blur", hideTip);
    return cell;
  }

  function lensTip(k, j) {
    var c = G[k][j];
    var lines = [rowName(k) + " \u00b7 " + tokenName(j),
                 "lens top-1: \u201c" + vis(c.text) + "\u201d (id " + c.id + ")  p = " +
                 num(c.prob),
                 "\u2016resid\u2016 = " + num(c.resid_norm)];
    if (k > 0) {
      lines.push("\u2016\u0394\u2016 = " + num(c.added_norm) + "  \u2016attn\u2016 = " +
                 num(c.attn_norm) + "  \u2016mlp\u2016 = " + num(c.mlp_norm));
    }
    if (c.top_k && c.top_k.length > 1) {
      lines.push("lens top-" + c.top_k.length + ": " + c.top_k.map(function (t) {
        return "\u201c" + vis(t.text) + "\u201d " + num(t.prob);
      }).join(", "));
    }
    return lines.join("\n");
  }

  // ---- the explorer's parts
  root.appendChild(el("p", { "class": "hint", text: "Hover any cell for its exact values. " +
    "Click a token for its row across blocks, a block (or a cell) for what its attention and " +
    "MLP added. Keys: \u2190/\u2192 token, \u2191/\u2193 block, Enter opens, Escape closes." }));
  var strip = el("div", { "class": "strip", role: "toolbar", "aria-label": "tokens" });
  var tokenButtons = [];
  for (var j = 0; j < N; j++) {
    var b = el("button", { type: "button", "data-pos": String(j), title: tokenName(j),
                           text: vis(tokenAt(j).text) });
    b.addEventListener("click", (function (jj) {
      return function () { select(jj, sel.row, false); openPanels(true, false); };
    })(j));
    tokenButtons.push(b);
    strip.appendChild(b);
  }
  root.appendChild(strip);

  var lensTable = el("table", { "class": "heat lens", id: "lens",
                                "aria-label": "logit lens: layers by positions" });
  var head = el("tr", {}, [el("th", { text: "" })]);
  for (j = 0; j < N; j++) {
    head.appendChild(el("th", { scope: "col", text: vis(tokenAt(j).text) }));
  }
  lensTable.appendChild(el("thead", {}, [head]));
  var body = el("tbody");
  var cells = [], rowButtons = [];
  for (var k = 0; k < L1; k++) {
    var rb = el("button", { type: "button", "data-row": String(k), text: rowName(k) });
    rb.addEventListener("click", (function (kk) {
      return function () { select(sel.pos, kk, false); openPanels(false, true); };
    })(k));
    rowButtons.push(rb);
    var tr = el("tr", {}, [el("th", { scope: "row" }, [rb])]);
    cells.push([]);
    for (j = 0; j < N; j++) {
      var c = G[k][j], color = sequential(c.prob, 1);
      var td = el("td", { "data-row": String(k), "data-pos": String(j), tabindex: "-1",
                          text: vis(c.text) });
      td.style.background = color[0]; td.style.color = color[1];
      tipped(td, (function (kk, jj) { return function () { return lensTip(kk, jj); }; })(k, j));
      td.addEventListener("click", (function (kk, jj) {
        return function () { select(jj, kk, true); openPanels(true, true); };
      })(k, j));
      cells[k].push(td);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  lensTable.appendChild(body);
  root.appendChild(el("h3", { text: "Logit lens: the top-1 token at every block and position " +
                                   "(colour: its probability)" }));
  var lensRow = el("div", { "class": "lens-row" }, [el("div", { "class": "scroll" },
                                                        [lensTable])]);
  root.appendChild(lensRow);

  var panels = el("div", { "class": "panels" });
  var tokenPanel = el("div", { "class": "panel", id: "token-panel", role: "region",
                               "aria-label": "the selected token across blocks" });
  var blockPanel = el("div", { "class": "panel", id: "block-panel", role: "region",
                               "aria-label": "the selected block" });
  tokenPanel.hidden = blockPanel.hidden = true;
  panels.appendChild(tokenPanel); panels.appendChild(blockPanel);
  lensRow.appendChild(panels);

  function closeButton(which) {
    var b = el("button", { type: "button", "class": "close", "aria-label": "close",
                           text: "\u00d7" });
    b.addEventListener("click", function () {
      if (which === "token") { open.token = false; } else { open.block = false; }
      render();
      cells[sel.row][sel.pos].focus();
    });
    return b;
  }
  function table(headers, rows, selected) {
    var t = el("table");
    t.appendChild(el("thead", {}, [el("tr", {}, headers.map(function (h) {
      return el("th", { "class": h[1] ? "text" : "", text: h[0] });
    }))]));
    var tb = el("tbody");
    rows.forEach(function (r, i) {
      var tr = el("tr", { "data-index": String(i) }, r.map(function (v, n) {
        return el("td", { "class": headers[n] && headers[n][1] ? "text" : "",
                          text: typeof v === "number" || v === null ? num(v) : v });
      }));
      if (i === selected) { tr.className = "sel"; }
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    return t;
  }
  function topk(c) {
    return (c.top_k || []).map(function (t) { return vis(t.text) + " " + num(t.prob); }).join("  ");
  }

  function fillToken() {
    var j = sel.pos;
    tokenPanel.textContent = "";
    tokenPanel.appendChild(closeButton("token"));
    tokenPanel.appendChild(el("h3", { text: "Token at " + tokenName(j) + ", block by block" }));
    var rows = [];
    for (var k = 0; k < L1; k++) {
      var c = G[k][j];
      rows.push([rowName(k), c.resid_norm, k ? c.added_norm : "", k ? c.attn_norm : "",
                 k ? c.mlp_norm : "", vis(c.text), c.prob, topk(c)]);
    }
    tokenPanel.appendChild(table([["layer", true], ["\u2016resid\u2016"], ["\u2016\u0394\u2016"],
      ["\u2016attn\u2016"], ["\u2016mlp\u2016"], ["lens top-1", true], ["p"], ["lens top-k", true]],
      rows, sel.row));
  }

  function detailsFor(block) {
    var out = [];
    (D.sections || []).forEach(function (s) {
      (s.blocks || []).forEach(function (b) { if (b.block === block) { out.push(b); } });
    });
    return out;
  }
  function fillBlock() {
    var k = sel.row, layer = T.layers[k];
    blockPanel.textContent = "";
    blockPanel.appendChild(closeButton("block"));
    blockPanel.appendChild(el("h3", { text: k === 0 ? "The embedding" :
      "Block " + (k - 1) + ": what its attention and MLP added" }));
    var rows = [];
    for (var j = 0; j < N; j++) {
      var c = G[k][j];
      rows.push([String(P[j]), vis(tokenAt(j).text), c.resid_norm, k ? c.added_norm : "",
                 k ? c.attn_norm : "", k ? c.mlp_norm : "", vis(c.text), c.prob]);
    }
    blockPanel.appendChild(table([["pos"], ["token", true], ["\u2016resid\u2016"],
      ["\u2016\u0394\u2016"], ["\u2016attn\u2016"], ["\u2016mlp\u2016"], ["lens top-1", true],
      ["p"]],
      rows, sel.pos));
    if (layer) {
      var last = [["cos(previous stream)", layer.cos_prev],
                  ["final top-1's rank in the lens", layer.lens_rank],
                  ["lens entropy (nats)", layer.lens_entropy],
                  ["KL(final \u2016 lens) (nats)", layer.lens_kl]];
      blockPanel.appendChild(el("h3", { text: "At the last position" }));
      blockPanel.appendChild(table([["", true], ["value"]], last.filter(function (r) {
        return r[1] !== null && r[1] !== undefined;
      }), -1));
    }
    if (k > 0) {
      detailsFor(k - 1).forEach(function (d) {
        blockPanel.appendChild(el("h3", { text: d.title }));
        blockPanel.appendChild(table([["", true], ["value", true]], d.rows.map(function (r) {
          return [r[0], typeof r[1] === "number" || r[1] === null ? num(r[1]) : String(r[1])];
        }), -1));
      });
    }
  }

  function render() {
    tokenButtons.forEach(function (b, j) {
      b.classList.toggle("sel", j === sel.pos);
      b.setAttribute("aria-pressed", j === sel.pos ? "true" : "false");
    });
    rowButtons.forEach(function (b, k) {
      b.classList.toggle("sel", k === sel.row);
      b.setAttribute("aria-pressed", k === sel.row ? "true" : "false");
    });
    for (var k = 0; k < L1; k++) {
      for (var j = 0; j < N; j++) {
        var td = cells[k][j];
        td.classList.toggle("col", j === sel.pos);
        td.classList.toggle("row", k === sel.row);
        td.classList.toggle("cur", j === sel.pos && k === sel.row);
        td.setAttribute("tabindex", j === sel.pos && k === sel.row ? "0" : "-1");
        td.setAttribute("aria-selected", j === sel.pos && k === sel.row ? "true" : "false");
      }
    }
    tokenPanel.hidden = !open.token;
    blockPanel.hidden = !open.block;
    if (open.token) { fillToken(); }
    if (open.block) { fillBlock(); }
    root.setAttribute("data-pos", String(sel.pos));
    root.setAttribute("data-row", String(sel.row));
  }
  function select(j, k, focusCell) {
    sel.pos = Math.max(0, Math.min(N - 1, j));
    sel.row = Math.max(0, Math.min(L1 - 1, k));
    render();
    if (focusCell) { cells[sel.row][sel.pos].focus(); }
  }
  function openPanels(token, block) {
    if (token) { open.token = true; }
    if (block) { open.block = true; }
    render();
  }
  function selectBlock(block) { select(sel.pos, block + 1, false); openPanels(false, true); }

  root.addEventListener("keydown", function (e) {
    var t = e.target;
    var move = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1],
                 ArrowDown: [0, 1] }[e.key];
    if (move) {
      e.preventDefault();
      var inStrip = t && t.parentNode === strip, inRows = rowButtons.indexOf(t) >= 0;
      select(sel.pos + move[0], sel.row + move[1], !inStrip && !inRows);
      if (inStrip) { tokenButtons[sel.pos].focus(); }
      if (inRows) { rowButtons[sel.row].focus(); }
    } else if (e.key === "Enter" && t && t.tagName === "TD") {
      e.preventDefault();
      openPanels(true, true);
    } else if (e.key === "Escape") {
      open.token = open.block = false;
      hideTip();
      render();
    }
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape" && !root.contains(e.target)) {
      open.token = open.block = false;
      hideTip();
      render();
    }
  });

  // ---- each section's heatmaps, hoverable the same way
  (D.sections || []).forEach(function (s) {
    (s.heatmaps || []).forEach(function (h, n) {
      var box = document.createElement("div");
      box.className = "section-heatmap";
      box.setAttribute("data-section", s.title);
      box.appendChild(el("h3", { text: s.title + ": " + h.title }));
      var top = 0;
      h.values.forEach(function (r) { r.forEach(function (v) {
        if (v !== null) { top = Math.max(top, Math.abs(v)); } }); });
      var t = el("table", { "class": "heat", "aria-label": h.title });
      var hr = el("tr", {}, [el("th", { text: "" })]);
      h.columns.forEach(function (c) { hr.appendChild(el("th", { scope: "col", text: c })); });
      t.appendChild(el("thead", {}, [hr]));
      var tb = el("tbody");
      h.values.forEach(function (r, i) {
        var block = h.blocks && h.blocks.length ? h.blocks[i] : null;
        var label = el("th", { scope: "row" });
        if (block !== null && block !== undefined) {
          var b = el("button", { type: "button", "data-block": String(block), text: h.rows[i] });
          b.addEventListener("click", function () { selectBlock(block); });
          label.appendChild(b);
        } else { label.textContent = h.rows[i]; }
        var tr = el("tr", {}, [label]);
        r.forEach(function (v, jj) {
          var color = v === null ? ["#eee", "#111"] :
            (h.diverging ? diverging(v, top) : sequential(v, top));
          var td = el("td", { "data-i": String(i), "data-j": String(jj),
                              tabindex: i === 0 && jj === 0 ? "0" : "-1",
                              text: h.labels && h.labels.length ? h.labels[i][jj] :
                                (v === null ? "" : short(v)) });
          td.style.background = color[0]; td.style.color = color[1];
          tipped(td, function () {
            return h.title + "\n" + h.rows[i] + " \u00b7 " + h.columns[jj] + "\n" + h.value +
              " = " + num(v) + (h.tips && h.tips.length && h.tips[i][jj] ?
                                "\n" + h.tips[i][jj] : "");
          });
          if (block !== null && block !== undefined) {
            td.addEventListener("click", function () { selectBlock(block); });
          }
          tr.appendChild(td);
        });
        tb.appendChild(tr);
      });
      t.appendChild(tb);
      t.addEventListener("keydown", function (e) {  // arrows move between this grid's cells
        var move = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0],
                     ArrowDown: [1, 0] }[e.key];
        var at = e.target;
        if (!move || at.tagName !== "TD") { return; }
        e.preventDefault(); e.stopPropagation();
        var i = Number(at.getAttribute("data-i")) + move[0];
        var jj = Number(at.getAttribute("data-j")) + move[1];
        var next = t.querySelector('td[data-i="' + i + '"][data-j="' + jj + '"]');
        if (next) {
          at.setAttribute("tabindex", "-1");
          next.setAttribute("tabindex", "0");
          next.focus();
        }
      });
      box.appendChild(el("div", { "class": "scroll" }, [t]));
      root.appendChild(box);
    });
  });

  render();
})();
