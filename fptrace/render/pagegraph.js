// The page's node-link drawings (render/page.py inlines it after page.js): each section's
// `graphs` (render/pagedata.py's NodeGraph) drawn as inline SVG from the JSON block
// `fptrace-data`, beside the section's heatmaps in the explorer. x is the position (the
// prompt's tokens along the bottom), y the row (tokens at the bottom, outputs at the top);
// every node is a circle whose area grows with its size, every edge a curve coloured by its
// sign, its width and opacity growing with |weight|. The strongest `shown` edges are drawn
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

  function draw(s, g) {
    var C = g.columns.length, R = g.rows.length;
    var byId = {}, cells = {}, most = 1;
    g.nodes.forEach(function (n) {
      byId[n.id] = n;
      var key = n.row + ":" + n.position;
      (cells[key] = cells[key] || []).push(n);
      most = Math.max(most, cells[key].length);
    });
    var colW = Math.max(96, 16 * most + 16), rowH = R > 20 ? 22 : 30;
    var outputs = g.nodes.some(function (n) { return n.kind === "output"; });
    var left = 80, top = outputs ? 64 : 16, bottom = 44;  // room for the outputs' labels
    var W = left + colW * C + 60, H = top + rowH * R + bottom;
    var at = {}, biggest = 0;
    g.nodes.forEach(function (n) { biggest = Math.max(biggest, n.size); });
    Object.keys(cells).forEach(function (key) {
      var here = cells[key], step = Math.min(16, (colW - 12) / here.length);
      here.forEach(function (n, k) {
        at[n.id] = { x: left + colW * (n.position + 0.5) + (k - (here.length - 1) / 2) * step,
                     y: top + rowH * (R - 1 - n.row + 0.5),
                     r: 2.5 + 6.5 * (biggest > 0 ? Math.sqrt(Math.max(0, n.size) / biggest) : 0) };
      });
    });

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

    var pic = svg("svg", { "class": "graph", width: W, height: H, viewBox: "0 0 " + W + " " + H,
                           role: "img", "aria-label": g.title });
    g.rows.forEach(function (label, i) {
      var y = top + rowH * (R - 1 - i + 0.5);
      pic.appendChild(svg("line", { "class": "grid", x1: left, x2: W - 60, y1: y, y2: y }));
      var t = svg("text", { "class": "row-label", x: left - 6, y: y + 4 });
      t.textContent = label;
      pic.appendChild(t);
    });
    g.columns.forEach(function (label, p) {
      var t = svg("text", { "class": "col-label", x: left + colW * (p + 0.5),
                            y: top + rowH * R + 16 });
      t.textContent = short(label, Math.max(4, Math.floor(colW / 7)));
      pic.appendChild(t);
      var q = svg("text", { "class": "col-label pos", x: left + colW * (p + 0.5),
                            y: top + rowH * R + 32 });
      q.textContent = String(p);
      pic.appendChild(q);
    });

    var heaviest = 0;
    g.edges.forEach(function (e) { heaviest = Math.max(heaviest, Math.abs(e[2])); });
    var edgeLayer = svg("g", { "class": "edges" }), nodeLayer = svg("g", { "class": "nodes" });
    var ins = {}, outs = {}, paths = [];
    g.edges.forEach(function (e, i) {
      var a = at[e[0]], b = at[e[1]];
      if (!a || !b) { return; }
      var x = heaviest > 0 ? Math.sqrt(Math.abs(e[2]) / heaviest) : 0;
      var mid = (a.y + b.y) / 2;
      var path = svg("path", { "class": "gedge " + (e[2] >= 0 ? "pos" : "neg"),
                               d: "M" + a.x + " " + a.y + " C" + a.x + " " + mid + " " + b.x +
                                  " " + mid + " " + b.x + " " + b.y,
                               "stroke-width": (0.5 + 3.5 * x).toFixed(2),
                               "stroke-opacity": (0.15 + 0.7 * x).toFixed(2),
                               "data-source": e[0], "data-target": e[1],
                               "data-weight": String(e[2]) });
      paths.push(path);
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
    function highlight(n, on) {
      pic.classList.toggle("focus", on);
      (ins[n.id] || []).concat(outs[n.id] || []).forEach(function (i) {
        paths[i].classList.toggle("hl", on);
      });
      var circle = nodeLayer.querySelector('[data-id="' + n.id + '"]');
      if (circle) { circle.classList.toggle("hl", on); }
      if (!on) { return; }
      var into = ins[n.id] || [], from = outs[n.id] || [];
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

    g.nodes.forEach(function (n) {
      var p = at[n.id];
      if (n.kind === "output") {  // an output's label above it, slanted
        var label = svg("text", { "class": "out-label", x: p.x.toFixed(2),
                                  y: (p.y - p.r - 4).toFixed(2),
                                  transform: "rotate(-40 " + p.x.toFixed(2) + " " +
                                             (p.y - p.r - 4).toFixed(2) + ")" });
        label.textContent = short(n.label.replace(/^\u2192/, ""), 12);
        nodeLayer.appendChild(label);
      }
      var c = svg("circle", { "class": "gnode " + n.kind, cx: p.x.toFixed(2), cy: p.y.toFixed(2),
                              r: p.r.toFixed(2), "data-id": n.id, tabindex: "0" });
      var title = svg("title", {});
      title.textContent = n.label;
      c.appendChild(title);
      c.addEventListener("mouseenter", function () { highlight(n, true); });
      c.addEventListener("mouseleave", function () { highlight(n, false); });
      c.addEventListener("focus", function () { highlight(n, true); });
      c.addEventListener("blur", function () { highlight(n, false); });
      c.addEventListener("click", function () { open(n); });
      c.addEventListener("keydown", function (e) {
        if (e.key === "Enter") { e.preventDefault(); open(n); }
      });
      nodeLayer.appendChild(c);
    });

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
