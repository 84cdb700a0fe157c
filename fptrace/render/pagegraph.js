// The page's node-link drawings (render/page.py inlines it after page.js): each section's
// `graphs` (render/pagedata.py's NodeGraph) drawn as inline SVG from the JSON block
// `fptrace-data`, beside the section's heatmaps in the explorer. x is the position (the
// prompt's tokens along the bottom), y the row (tokens at the bottom, outputs at the top);
// every node is a circle whose area grows with its size, every edge a curve coloured by its
// sign, its width and opacity growing with |weight|. A cell's nodes sit in a grid of slots, the
// strongest first (after its error node and remainder, never hidden), so that no two circles
// overlap however many share it; a cell of more than CAP shows its strongest and a "+N more"
// marker that draws the rest when clicked (or Enter).
// The outputs' labels stand upright, one slot apart, so that none covers another. The strongest `shown` edges are drawn
// until more are asked for. Hovering (or focusing) a node highlights all of its edges and lists
// them with their weights; clicking it (or Enter) shows its activation at every position and
// its effect on each output. No file, font or library is fetched.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("fptrace-data").textContent);
  var root = document.getElementById("explore");
  if (!root) { return; }
  var NS = "http://www.w3.org/2000/svg";

  var el = window.fptraceEl;  // page.js's DOM builder (page.js is inlined before this script)
  function svg(tag, attrs) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }
  function signed(v) {  // six significant digits, with its sign
    var s = String(Number(v.toPrecision(6)));
    return v >= 0 ? "+" + s : s;
  }
  function short(s, n) { return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }
  function shade(v, top) {  // the page's diverging colours: positive red, negative blue
    var x = top > 0 ? Math.max(-1, Math.min(1, v / top)) : 0;
    return ["hsl(" + (x >= 0 ? 4 : 214) + ", 70%, " + (97 - 50 * Math.abs(x)) + "%)",
            Math.abs(x) > 0.7 ? "#fff" : "#111"];
  }

  var PITCH = 20;  // a node's slot in its cell: the largest circle (r 9) and a gap, so no two touch
  var WIDE = 8;  // a cell of up to WIDE nodes is one line of slots; more wrap to a grid
  var CAP = 16;  // a cell of more shows its CAP - 1 strongest and a "+N more" marker
  var MARK = 16;  // the marker's line under its cell's grid
  function outLabel(n) { return n.label.replace(/^\u2192/, ""); }

  // Where everything goes, given which crowded cells are opened (`open`: their keys): each column
  // as wide and each row as tall as its most crowded cell needs (a column of one node per cell
  // stays narrow), the nodes of a cell in a grid of slots, the strongest first (left to right,
  // then down); a crowded cell's weaker nodes are hidden behind its marker, their edges ending
  // there.
  function layout(g, cells, open, radius, top) {
    var C = g.columns.length, R = g.rows.length, base = R > 20 ? 22 : 30, bottom = 44;
    var colW = g.columns.map(function () { return 96; }), rowH = g.rows.map(function () {
      return base; });
    var shape = {};
    Object.keys(cells).forEach(function (key) {
      var here = cells[key], first = here[0];
      var outputs = here.some(function (n) { return n.kind === "output"; });
      var crowded = !outputs && here.length > CAP;  // the outputs (at most ten) stay on one line
      var shown = crowded && !open[key] ? CAP - 1 : here.length;
      var per = outputs || shown <= WIDE ? shown : Math.max(WIDE, Math.ceil(Math.sqrt(2 * shown)));
      var lines = Math.ceil(shown / per);
      shape[key] = { shown: shown, per: per, lines: lines, crowded: crowded,
                     h: lines * PITCH + (crowded ? MARK : 0) };
      colW[first.position] = Math.max(colW[first.position], per * PITCH + 16);
      rowH[first.row] = Math.max(rowH[first.row], shape[key].h + 8);
    });
    var xs = [80], ys = [], y = top;  // each column's left edge, each row's top (the last on top)
    colW.forEach(function (w, p) { xs.push(xs[p] + w); });
    for (var r = R - 1; r >= 0; r--) { ys[r] = y; y += rowH[r]; }
    var at = {}, marks = {};
    Object.keys(cells).forEach(function (key) {
      var here = cells[key], s = shape[key], p = here[0].position, r = here[0].row;
      var x0 = xs[p] + (colW[p] - s.per * PITCH) / 2, y0 = ys[r] + (rowH[r] - s.h) / 2;
      var mark = s.crowded ? { x: xs[p] + colW[p] / 2, y: y0 + s.lines * PITCH + MARK / 2 } :
        null;
      marks[key] = mark;
      here.forEach(function (n, k) {
        at[n.id] = k < s.shown ?
          { x: x0 + (k % s.per + 0.5) * PITCH, y: y0 + (Math.floor(k / s.per) + 0.5) * PITCH,
            r: radius(n), shown: true } :
          { x: mark.x, y: mark.y, r: radius(n), shown: false };
      });
    });
    return { at: at, marks: marks, shape: shape, xs: xs, ys: ys, colW: colW, rowH: rowH,
             W: xs[C] + 60, H: y + bottom, bottom: y };
  }

  function draw(s, g) {
    var byId = {}, cells = {}, biggest = 0, chars = 0;
    g.nodes.forEach(function (n, i) {
      byId[n.id] = n;
      var key = n.row + ":" + n.position;
      (cells[key] = cells[key] || []).push([n, i]);
      biggest = Math.max(biggest, n.size);
      if (n.kind === "output") { chars = Math.max(chars, Math.min(14, outLabel(n).length)); }
    });
    // a cell's error node and remainder first (what its named nodes leave out is never hidden
    // behind a crowded cell's marker, however weak), then the strongest first, else in the
    // data's order
    function unnamed(n) { return n.kind === "error" || n.kind === "remainder" ? 0 : 1; }
    Object.keys(cells).forEach(function (key) {
      cells[key] = cells[key].sort(function (a, b) {
        return (unnamed(a[0]) - unnamed(b[0])) || (b[0].size - a[0].size) || (a[1] - b[1]);
      }).map(function (x) { return x[0]; });
    });
    function radius(n) {
      return 2.5 + 6.5 * (biggest > 0 ? Math.sqrt(Math.max(0, n.size) / biggest) : 0);
    }
    var top = chars ? 14 + Math.ceil(6.2 * chars) : 16;  // room for the outputs' upright labels
    var opened = {};  // the crowded cells whose every node is drawn (their marker clicked)
    var L = layout(g, cells, opened, radius, top);

    var box = el("div", { "class": "section-graph", "data-section": s.title });
    box.appendChild(el("h3", { text: s.title + ": " + g.title }));
    var count = el("span", { "class": "graph-count" });
    var input = el("input", { type: "number", min: "0", max: String(g.edges.length),
                              value: String(g.shown), "aria-label": "edges drawn" });
    box.appendChild(el("p", { "class": "hint" }, [count, el("label", { text: " Draw the " }),
      input, el("span", { text: " strongest (by |weight|)." })]));
    var legend = el("p", { "class": "graph-legend" });
    (g.kinds || []).forEach(function (k) {
      var dot = svg("svg", { width: 12, height: 12, "aria-hidden": "true" });
      dot.appendChild(svg("circle", { "class": "gnode key " + k[0], cx: 6, cy: 6, r: 5 }));
      legend.appendChild(el("span", {}, [dot, el("span", { text: " " + k[1] })]));
    });
    legend.appendChild(el("span", { "class": "edge-pos", text: "\u2501 positive edge" }));
    legend.appendChild(el("span", { "class": "edge-neg", text: "\u2501 negative edge" }));
    box.appendChild(legend);

    var pic = svg("svg", { "class": "graph", role: "img", "aria-label": g.title });
    var rowLines = g.rows.map(function (label) {
      var line = svg("line", { "class": "grid" });
      var t = svg("text", { "class": "row-label" });
      t.textContent = label;
      pic.appendChild(line);
      pic.appendChild(t);
      return [line, t];
    });
    var colLabels = g.columns.map(function (label, p) {
      var t = svg("text", { "class": "col-label" }), q = svg("text", { "class": "col-label pos" });
      q.textContent = String(p);
      pic.appendChild(t);
      pic.appendChild(q);
      return [t, q];
    });

    var heaviest = 0;
    g.edges.forEach(function (e) { heaviest = Math.max(heaviest, Math.abs(e[2])); });
    var edgeLayer = svg("g", { "class": "edges" }), nodeLayer = svg("g", { "class": "nodes" });
    var ins = {}, outs = {}, paths = [];
    g.edges.forEach(function (e, i) {
      if (!byId[e[0]] || !byId[e[1]]) { return; }
      var x = heaviest > 0 ? Math.sqrt(Math.abs(e[2]) / heaviest) : 0;
      var path = svg("path", { "class": "gedge " + (e[2] >= 0 ? "pos" : "neg"),
                               "stroke-width": (0.5 + 3.5 * x).toFixed(2),
                               "stroke-opacity": (0.15 + 0.7 * x).toFixed(2),
                               "data-source": e[0], "data-target": e[1],
                               "data-weight": String(e[2]) });
      paths[i] = path;
      (ins[e[1]] = ins[e[1]] || []).push(i);
      (outs[e[0]] = outs[e[0]] || []).push(i);
      edgeLayer.appendChild(path);
    });
    pic.appendChild(edgeLayer);
    pic.appendChild(nodeLayer);

    function showing(n) {
      n = Math.max(0, Math.min(g.edges.length, Math.floor(Number(n) || 0)));
      paths.forEach(function (p, i) { p.classList.toggle("more", i >= n); });
      count.textContent = n + " of the " + g.edges.length + " kept edges drawn.";
      box.setAttribute("data-drawn", String(n));
    }
    input.addEventListener("change", function () { showing(input.value); });
    showing(g.shown);

    var hover = el("div", { "class": "panel graph-hover", role: "status" });
    var detail = el("div", { "class": "panel graph-detail", role: "region",
                             "aria-label": "the clicked node" });
    hover.textContent = "Hover a node for its edges; click it for its activations and its " +
      "effect on the logits.";
    detail.hidden = true;

    function edgeLines(list, end) {
      return list.map(function (i) {
        var e = g.edges[i], other = byId[e[end]];
        return "  " + signed(e[2]) + "  " + (other ? other.label : e[end]);
      });
    }
    function lit(list, on) {  // these edges highlighted (or no longer)
      pic.classList.toggle("focus", on);
      list.forEach(function (i) { paths[i].classList.toggle("hl", on); });
    }
    function highlight(n, on) {
      var into = ins[n.id] || [], from = outs[n.id] || [];
      lit(into.concat(from), on);
      circles[n.id].classList.toggle("hl", on);
      if (!on) { return; }
      hover.textContent = [n.info,
                           "in (" + into.length + " kept edges):"].concat(edgeLines(into, 0))
        .concat(["out (" + from.length + " kept edges):"]).concat(edgeLines(from, 1))
        .join("\n");
    }
    function open(n) {
      detail.textContent = "";
      detail.hidden = false;
      detail.setAttribute("data-id", n.id);
      detail.appendChild(el("h4", { text: n.label }));
      detail.appendChild(el("p", { text: n.info }));
      if (n.activations && n.activations.length) {
        var most = 0;
        n.activations.forEach(function (v) { most = Math.max(most, Math.abs(v)); });
        detail.appendChild(el("p", { text: "Its activation at every position of the prompt " +
          "(the same " + (n.kind === "node" ? "neuron or latent" : "node") + ", same block; " +
          "colour: the value over the largest |value|, " + signed(most).slice(1) + "):" }));
        var row = el("div", { "class": "acts" });
        n.activations.forEach(function (v, p) {
          var c = shade(v, most);
          var cell = el("span", { "data-position": String(p), "data-value": String(v),
                                  title: "position " + p + " " + g.columns[p] + ": " + signed(v) },
                        [el("span", { "class": "tok", text: g.columns[p] }),
                         el("span", { "class": "val", text: signed(v) })]);
          cell.style.background = c[0]; cell.style.color = c[1];
          if (p === n.position) { cell.classList.add("here"); }
          row.appendChild(cell);
        });
        detail.appendChild(row);
      }
      if (n.effects && n.effects.length) {
        detail.appendChild(el("p", { text: "Its effect on the logits: its direct edge into each " +
          "(from the whole graph; the pruning may drop it from the drawing) and its influence " +
          "on it alone:" }));
        var t = el("table", { "class": "effects" });
        t.appendChild(el("thead", {}, [el("tr", {}, [el("th", { "class": "text", text: "logit" }),
          el("th", { text: "direct edge" }), el("th", { text: "influence" })])]));
        var tb = el("tbody");
        n.effects.forEach(function (f) {
          var out = byId[f.node];
          tb.appendChild(el("tr", { "data-node": f.node }, [
            el("td", { "class": "text", text: out ? out.label : f.node }),
            el("td", { text: signed(f.edge) }), el("td", { text: signed(f.influence) })]));
        });
        t.appendChild(tb);
        detail.appendChild(t);
      }
    }

    function hoverable(target, n) {  // a node's circle (or its label): hover, focus, click
      target.addEventListener("mouseenter", function () { highlight(n, true); });
      target.addEventListener("mouseleave", function () { highlight(n, false); });
      target.addEventListener("focus", function () { highlight(n, true); });
      target.addEventListener("blur", function () { highlight(n, false); });
      target.addEventListener("click", function () { open(n); });
      target.addEventListener("keydown", function (e) {
        if (e.key === "Enter") { e.preventDefault(); open(n); }
      });
    }
    var circles = {}, labels = {};
    g.nodes.forEach(function (n) {
      if (n.kind === "output") {  // an output's label upright above it; in full in its title
        var label = svg("text", { "class": "out-label", "data-id": n.id,
                                  "dominant-baseline": "central" });
        label.textContent = short(outLabel(n), 14);
        var full = svg("title", {});
        full.textContent = n.label;
        label.appendChild(full);
        hoverable(label, n);
        labels[n.id] = label;
        nodeLayer.appendChild(label);
      }
      var c = svg("circle", { "class": "gnode " + n.kind, "data-id": n.id, tabindex: "0" });
      var title = svg("title", {});
      title.textContent = n.label;
      c.appendChild(title);
      hoverable(c, n);
      circles[n.id] = c;
      nodeLayer.appendChild(c);
    });

    // a crowded cell's marker: "+N more" (its weaker nodes hidden, their edges ending here);
    // a click or Enter draws every node of the cell, another draws the strongest again
    var marks = {};
    Object.keys(cells).forEach(function (key) {
      if (!L.shape[key].crowded) { return; }
      var here = cells[key], hidden = here.slice(CAP - 1), edges = [];
      hidden.forEach(function (n) { edges = edges.concat(ins[n.id] || [], outs[n.id] || []); });
      var where = g.rows[here[0].row] + ", position " + here[0].position + " " +
        g.columns[here[0].position];
      var m = svg("g", { "class": "gmore", tabindex: "0", role: "button", "data-cell": key,
                         "data-hidden": hidden.length });
      var rect = svg("rect", { rx: 6, height: MARK - 3 }), t = svg("text", {
        "dominant-baseline": "central" });
      m.appendChild(rect);
      m.appendChild(t);
      function told(on) {
        lit(opened[key] ? [] : edges, on);
        if (!on) { return; }
        hover.textContent = opened[key] ?
          "All " + here.length + " nodes at " + where + " are drawn, the strongest first. " +
          "Click (or Enter) to draw only the " + (CAP - 1) + " strongest again." :
          hidden.length + " more nodes at " + where + ": the weakest of its " + here.length +
          " by influence (an error node or remainder is always drawn), hidden so that no " +
          "circle covers another; their " + edges.length +
          " kept edges end at this marker. Click (or Enter) to draw them all.";
      }
      function toggle() {
        told(false);
        opened[key] = !opened[key];
        place();
        told(true);
      }
      m.addEventListener("mouseenter", function () { told(true); });
      m.addEventListener("mouseleave", function () { told(false); });
      m.addEventListener("focus", function () { told(true); });
      m.addEventListener("blur", function () { told(false); });
      m.addEventListener("click", toggle);
      m.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggle(); }
      });
      marks[key] = [m, rect, t, hidden.length];
      nodeLayer.appendChild(m);
    });

    function place() {  // every element where the layout (with the opened cells) puts it
      L = layout(g, cells, opened, radius, top);
      var W = L.W, H = L.H, f = function (v) { return v.toFixed(2); };
      [["width", W], ["height", H], ["viewBox", "0 0 " + W + " " + H]].forEach(function (a) {
        pic.setAttribute(a[0], String(a[1]));
      });
      rowLines.forEach(function (both, r) {
        var y = L.ys[r] + L.rowH[r] / 2;
        [["x1", 80], ["x2", W - 60], ["y1", y], ["y2", y]].forEach(function (a) {
          both[0].setAttribute(a[0], f(a[1])); });
        both[1].setAttribute("x", "74");
        both[1].setAttribute("y", f(y + 4));
      });
      colLabels.forEach(function (both, p) {
        var x = f(L.xs[p] + L.colW[p] / 2);
        both[0].textContent = short(g.columns[p], Math.max(4, Math.floor(L.colW[p] / 7)));
        both[0].setAttribute("x", x); both[0].setAttribute("y", f(L.bottom + 16));
        both[1].setAttribute("x", x); both[1].setAttribute("y", f(L.bottom + 32));
      });
      g.nodes.forEach(function (n) {
        var a = L.at[n.id], c = circles[n.id];
        c.setAttribute("cx", f(a.x)); c.setAttribute("cy", f(a.y)); c.setAttribute("r", f(a.r));
        if (a.shown) { c.removeAttribute("display"); } else { c.setAttribute("display", "none"); }
        if (labels[n.id]) {
          var x = f(a.x), y = f(a.y - a.r - 4);
          labels[n.id].setAttribute("x", x); labels[n.id].setAttribute("y", y);
          labels[n.id].setAttribute("transform", "rotate(-90 " + x + " " + y + ")");
        }
      });
      g.edges.forEach(function (e, i) {
        if (!paths[i]) { return; }
        var a = L.at[e[0]], b = L.at[e[1]], mid = (a.y + b.y) / 2;
        paths[i].setAttribute("d", "M" + f(a.x) + " " + f(a.y) + " C" + f(a.x) + " " + f(mid) +
                              " " + f(b.x) + " " + f(mid) + " " + f(b.x) + " " + f(b.y));
      });
      Object.keys(marks).forEach(function (key) {
        var m = marks[key], at = L.marks[key], open = !!opened[key];
        var text = open ? "\u2212 only " + (CAP - 1) : "+" + m[3] + " more";
        var w = 6 * text.length + 10;
        m[2].textContent = text;
        m[1].setAttribute("x", f(at.x - w / 2)); m[1].setAttribute("y", f(at.y - (MARK - 3) / 2));
        m[1].setAttribute("width", f(w));
        m[2].setAttribute("x", f(at.x)); m[2].setAttribute("y", f(at.y));
        m[0].setAttribute("aria-expanded", String(open));
        m[0].setAttribute("aria-label", open ? "draw only the " + (CAP - 1) + " strongest" :
                          "draw " + m[3] + " more nodes");
      });
    }
    place();
    if (Object.keys(marks).length) {
      legend.appendChild(el("span", { "class": "more-key", text: "+N more: a crowded cell's " +
        "weaker nodes (click or Enter draws them)" }));
    }

    box.appendChild(el("div", { "class": "graph-row" }, [el("div", { "class": "scroll" }, [pic]),
      el("div", { "class": "graph-panels" }, [hover, detail])]));
    return box;
  }

  (D.sections || []).forEach(function (s) {
    var after = null;  // each drawing follows its section's heatmaps (or ends the explorer)
    root.querySelectorAll(".section-heatmap").forEach(function (h) {
      if (h.getAttribute("data-section") === s.title) { after = h; }
    });
    (s.graphs || []).forEach(function (g) {
      var box = draw(s, g);
      if (after) { after.parentNode.insertBefore(box, after.nextSibling); } else {
        root.appendChild(box);
      }
      after = box;
    });
  });
})();
