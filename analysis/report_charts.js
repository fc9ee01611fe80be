// dlcsniff report: the interactive charts (timelines, CDFs, scatter plots, traffic matrices), drawn on <canvas>
// from the JSON specs analysis/report_charts.py writes into the page. No library, no network: the report is one
// file that works offline. Each chart's root element carries its visible range in data-x-min / data-x-max
// (data-y-min / data-y-max) and what it drew in data-drawn, for the tests and for anyone scripting the page.
"use strict";
(function () {
  const FONT = "12px sans-serif";
  const SMALL = "11px sans-serif";
  const GRID = "#e4e4e4";
  const AXIS = "#555";
  const PAD = {top: 10, right: 16, bottom: 42};
  const LANE_PX = 18;          // a timeline row, unless its spec says (lane_px)
  const HIT_PX = 8;

  // -- numbers and units -------------------------------------------------------------------------------------
  function group3(text) { return text.replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function plain(value) {
    if (!isFinite(value)) return "n/a";
    const magnitude = Math.abs(value);
    if (magnitude >= 1000) return group3(Math.round(value).toString());
    return Number(value.toPrecision(4)).toString();
  }
  function humanBytes(value) {
    if (value >= 1e9) return (value / 1e9).toFixed(2) + " GB";
    if (value >= 1e6) return (value / 1e6).toFixed(2) + " MB";
    if (value >= 1e3) return (value / 1e3).toFixed(2) + " kB";
    return Math.round(value) + " B";
  }
  const FORMATS = {
    ms: (v) => plain(v) + " ms",
    bytes: (v) => isFinite(v) ? humanBytes(v) + (v >= 1e3 ? " (" + group3(Math.round(v).toString()) + " B)" : "")
                              : "n/a",
    gbps: (v) => plain(v) + " GB/s",
    fraction: (v) => (v * 100).toFixed(1) + " %",
    percent: (v) => plain(v) + " %",
    count: (v) => group3(Math.round(v).toString()),
    number: plain,
  };
  const TICK_FORMATS = {
    bytes: (v) => humanBytes(v).replace(".00", ""),
    fraction: (v) => Math.round(v * 100) + " %",
  };
  function formatValue(format, value) { return (FORMATS[format] || plain)(value); }
  function formatTick(format, value) { return (TICK_FORMATS[format] || plain)(value); }

  // -- scales and ticks --------------------------------------------------------------------------------------
  function niceStep(span, count) {
    const raw = span / Math.max(count, 1);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
    return 10 * power;
  }
  function linearTicks(lo, hi, count) {
    const step = niceStep(hi - lo, count);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
    return ticks;
  }
  function logTicks(lo, hi, count) {
    const first = Math.floor(Math.log10(lo)), last = Math.ceil(Math.log10(hi));
    if (last - first < 1.5) return linearTicks(lo, hi, count);
    const every = Math.max(1, Math.ceil((last - first) / count));
    const ticks = [];
    for (let d = first; d <= last; d += every) {
      const mults = last - first <= 3 ? [1, 2, 5] : [1];
      for (const m of mults) { const t = m * Math.pow(10, d); if (t >= lo && t <= hi) ticks.push(t); }
    }
    return ticks;
  }
  class Scale {
    constructor(log) { this.log = !!log; this.lo = 0; this.hi = 1; this.a = 0; this.b = 1; }
    t(v) { return this.log ? Math.log10(v) : v; }
    u(v) { return this.log ? Math.pow(10, v) : v; }
    map(v) { return this.a + (this.t(v) - this.t(this.lo)) / (this.t(this.hi) - this.t(this.lo)) * (this.b - this.a); }
    invert(px) { return this.u(this.t(this.lo) + (px - this.a) / (this.b - this.a) * (this.t(this.hi) - this.t(this.lo))); }
    ticks(count) { return this.log ? logTicks(this.lo, this.hi, count) : linearTicks(this.lo, this.hi, count); }
    // the domain zoomed by `factor` around the value at pixel px (factor < 1 zooms in)
    zoomed(px, factor) {
      const c = this.t(this.invert(px)), lo = this.t(this.lo), hi = this.t(this.hi);
      return [this.u(c - (c - lo) * factor), this.u(c + (hi - c) * factor)];
    }
    panned(dpx) {
      const shift = dpx / (this.b - this.a) * (this.t(this.hi) - this.t(this.lo));
      return [this.u(this.t(this.lo) - shift), this.u(this.t(this.hi) - shift)];
    }
  }

  // -- one chart ---------------------------------------------------------------------------------------------
  class Chart {
    constructor(root, spec) {
      this.root = root;
      this.spec = spec;
      this.canvas = document.createElement("canvas");
      this.canvas.setAttribute("role", "img");
      this.canvas.setAttribute("aria-label", spec.title || spec.type);
      this.tip = document.createElement("div");
      this.tip.className = "chart-tip";
      const tools = document.createElement("div");
      tools.className = "chart-tools";
      const reset = document.createElement("button");
      reset.type = "button";
      reset.textContent = "reset zoom";
      reset.addEventListener("click", () => this.reset());
      const hint = document.createElement("span");
      hint.textContent = spec.type === "matrix" ? "hover a cell for its values"
        : "drag: zoom to a " + (spec.type === "timeline" ? "time range" : "box")
          + " · shift+drag: pan · ctrl+wheel or pinch: zoom · double-click: reset · hover: details";
      if (spec.type !== "matrix") tools.append(reset);
      tools.append(hint);
      root.append(tools, this.canvas, this.tip);
      if (spec.legend) root.append(this.legend(spec.legend));
      // a timeline of a few rows gets taller rows: at least ~200 px of plot
      this.lane = spec.lane_px || (spec.lanes ? Math.max(LANE_PX, Math.min(32, Math.floor(200 / spec.lanes.length))) : LANE_PX);
      this.x = new Scale(spec.x_log);
      this.y = new Scale(spec.y_log);
      this.hidden = new Set();
      this.reset(false);
      this.listen();
      this.draw();
    }

    legend(entries) {
      const box = document.createElement("div");
      box.className = "chart-legend";
      entries.forEach((entry, index) => {
        const item = document.createElement("button");
        item.type = "button";
        item.innerHTML = "<i></i>";
        item.firstChild.style.background = entry.color;
        item.append(document.createTextNode(entry.label));
        item.title = "show / hide";
        item.addEventListener("click", () => {
          if (this.hidden.has(index)) this.hidden.delete(index); else this.hidden.add(index);
          item.classList.toggle("off", this.hidden.has(index));
          this.draw();
        });
        box.append(item);
      });
      return box;
    }

    reset(redraw = true) {
      const s = this.spec;
      [this.x.lo, this.x.hi] = s.x_range;
      if (s.y_range) [this.y.lo, this.y.hi] = s.y_range;
      if (redraw) this.draw();
    }

    // what the chart shows: lanes (timeline), the matrix' rows, or nothing on a categorical axis
    height() {
      const s = this.spec;
      if (s.type === "timeline") return PAD.top + PAD.bottom + s.lanes.length * this.lane;
      if (s.type === "matrix") return PAD.top + PAD.bottom + 56 + s.rows.length * s.cell_px;
      return s.height_px || 380;
    }

    layout(ctx) {
      const s = this.spec;
      ctx.font = FONT;
      const labels = s.type === "timeline" ? s.lanes.map((l) => l.label) : s.type === "matrix" ? s.rows : [];
      const widest = labels.reduce((w, l) => Math.max(w, ctx.measureText(l).width), 0);
      const left = Math.max(64, Math.ceil(widest) + (s.type === "timeline" ? 14 : 22)) + (s.y_label ? 18 : 0);
      // a matrix is as wide as its cells (and its rotated last label); the others fill the page's width
      const width = s.type === "matrix" ? left + s.cols.length * s.cell_px + 48 : this.root.clientWidth || 900;
      const plotRight = s.type === "matrix" ? left + s.cols.length * s.cell_px : width - PAD.right;
      this.area = {left: left, top: PAD.top, right: plotRight, bottom: this.height() - PAD.bottom};
      this.x.a = this.area.left; this.x.b = this.area.right;
      this.y.a = this.area.bottom; this.y.b = this.area.top;
      return width;
    }

    draw() {
      const dpr = window.devicePixelRatio || 1;
      const ctx = this.canvas.getContext("2d");
      const width = this.layout(ctx);
      const height = this.height();
      this.canvas.width = Math.round(width * dpr);
      this.canvas.height = Math.round(height * dpr);
      this.canvas.style.width = width + "px";
      this.canvas.style.height = height + "px";
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, width, height);
      ctx.font = FONT;
      this.items = [];
      if (this.spec.type === "matrix") this.drawMatrix(ctx);
      else {
        this.drawGrid(ctx);
        ctx.save();
        ctx.beginPath();
        ctx.rect(this.area.left, this.area.top, this.area.right - this.area.left, this.area.bottom - this.area.top);
        ctx.clip();
        if (this.spec.type === "timeline") this.drawBars(ctx); else this.drawSeries(ctx);
        ctx.restore();
        this.drawFrame(ctx);
      }
      const d = this.root.dataset;
      d.xMin = this.x.lo; d.xMax = this.x.hi;
      if (this.spec.y_range) { d.yMin = this.y.lo; d.yMax = this.y.hi; }
      d.drawn = this.items.length;
    }

    drawGrid(ctx) {
      const a = this.area, s = this.spec;
      ctx.strokeStyle = GRID; ctx.fillStyle = AXIS; ctx.lineWidth = 1;
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      for (const t of this.x.ticks(Math.max(2, Math.floor((a.right - a.left) / 90)))) {
        const px = Math.round(this.x.map(t)) + 0.5;
        ctx.beginPath(); ctx.moveTo(px, a.top); ctx.lineTo(px, a.bottom); ctx.stroke();
        ctx.fillText(formatTick(s.x_format, t), px, a.bottom + 5);
      }
      ctx.fillText(s.x_label, (a.left + a.right) / 2, a.bottom + 23);
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      if (s.type === "timeline") {
        let previous = null;
        s.lanes.forEach((lane, i) => {
          const mid = a.top + (i + 0.5) * this.lane;
          if (lane.group !== previous && i > 0) {
            ctx.strokeStyle = "#999";
            ctx.beginPath(); ctx.moveTo(4, a.top + i * this.lane + 0.5); ctx.lineTo(a.right, a.top + i * this.lane + 0.5); ctx.stroke();
          }
          previous = lane.group;
          ctx.font = lane.head ? "bold " + SMALL : SMALL;
          ctx.fillText(lane.label, a.left - 8, mid);
        });
        ctx.font = FONT;
        return;
      }
      for (const t of this.y.ticks(Math.max(2, Math.floor((a.bottom - a.top) / 50)))) {
        const py = Math.round(this.y.map(t)) + 0.5;
        ctx.beginPath(); ctx.moveTo(a.left, py); ctx.lineTo(a.right, py); ctx.stroke();
        ctx.fillText(formatTick(s.y_format, t), a.left - 6, py);
      }
      this.yLabel(ctx);
    }

    yLabel(ctx) {
      if (!this.spec.y_label) return;
      ctx.save();
      ctx.translate(12, (this.area.top + this.area.bottom) / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "center"; ctx.textBaseline = "middle"; ctx.fillStyle = AXIS;
      ctx.fillText(this.spec.y_label, 0, 0);
      ctx.restore();
    }

    drawFrame(ctx) {
      const a = this.area;
      ctx.strokeStyle = AXIS;
      ctx.strokeRect(a.left + 0.5, a.top + 0.5, a.right - a.left, a.bottom - a.top);
      if (this.band) {
        ctx.fillStyle = "rgba(30, 110, 220, 0.15)";
        const b = this.band;
        ctx.fillRect(Math.min(b.x0, b.x1), this.spec.type === "timeline" ? a.top : Math.min(b.y0, b.y1),
          Math.abs(b.x1 - b.x0), this.spec.type === "timeline" ? a.bottom - a.top : Math.abs(b.y1 - b.y0));
      }
    }

    drawBars(ctx) {
      const s = this.spec, a = this.area;
      s.layers.forEach((layer, li) => {
        const c = layer.columns, n = c.x0.length;
        for (let i = 0; i < n; i++) {
          const color = c.color[i];
          if (this.hidden.has(color) || c.x1[i] < this.x.lo || c.x0[i] > this.x.hi) continue;
          const x0 = this.x.map(c.x0[i]);
          const w = Math.max(1, this.x.map(c.x1[i]) - x0);
          const h = this.lane * (layer.height || 0.7);
          const y = a.top + (c.lane[i] + (layer.offset || 0)) * this.lane + (this.lane - h) / 2;
          ctx.fillStyle = s.legend[color].color;
          ctx.fillRect(x0, y, w, h);
          if (w > 6 && layer.outline) { ctx.strokeStyle = "rgba(0,0,0,0.35)"; ctx.strokeRect(x0 + 0.5, y + 0.5, w - 1, h - 1); }
          if (layer.text && w > 40) {
            ctx.fillStyle = "#222"; ctx.textAlign = "left"; ctx.textBaseline = "middle"; ctx.font = SMALL;
            ctx.fillText(layer.text[i], Math.max(x0, a.left) + 3, y + h / 2, w - 6);
          }
          this.items.push({layer: li, index: i, x0: x0, x1: x0 + w, y0: y, y1: y + h});
        }
      });
    }

    drawSeries(ctx) {
      const s = this.spec;
      s.series.forEach((series, si) => {
        if (this.hidden.has(series.legend)) return;
        const color = s.legend[series.legend].color;
        const xs = series.x, ys = series.y;
        if (series.mode !== "points") {
          ctx.strokeStyle = color; ctx.lineWidth = series.width || 1.8;
          ctx.globalAlpha = series.alpha || 1;
          ctx.setLineDash(series.dash ? [6, 4] : []);
          ctx.beginPath();
          for (let i = 0; i < xs.length; i++) {
            const px = this.x.map(xs[i]), py = this.y.map(ys[i]);
            if (i === 0) ctx.moveTo(px, py);
            else if (series.mode === "step") { ctx.lineTo(px, this.y.map(ys[i - 1])); ctx.lineTo(px, py); }
            else ctx.lineTo(px, py);
          }
          ctx.stroke();
          ctx.setLineDash([]);
          ctx.globalAlpha = 1;
        }
        const radius = series.radius || (series.mode === "points" ? 4 : 0);
        for (let i = 0; i < xs.length; i++) {
          if (xs[i] < this.x.lo || xs[i] > this.x.hi || ys[i] < this.y.lo || ys[i] > this.y.hi) continue;
          const px = this.x.map(xs[i]), py = this.y.map(ys[i]);
          if (radius) {
            ctx.beginPath(); ctx.arc(px, py, radius, 0, 2 * Math.PI);
            ctx.globalAlpha = series.alpha || 1; ctx.fillStyle = color; ctx.fill(); ctx.globalAlpha = 1;
            if (series.edge) { ctx.strokeStyle = "#222"; ctx.lineWidth = 0.6; ctx.stroke(); }
          }
          this.items.push({series: si, index: i, px: px, py: py});
        }
      });
    }

    drawMatrix(ctx) {
      const s = this.spec, a = this.area, px = s.cell_px;
      ctx.textAlign = "center"; ctx.textBaseline = "middle";
      s.rows.forEach((row, r) => {
        s.cols.forEach((col, c) => {
          const x = a.left + c * px, y = a.top + r * px, value = s.values[r][c];
          ctx.fillStyle = value === null ? "#fafafa" : s.colors[r][c];
          ctx.fillRect(x, y, px - 1, px - 1);
          if (value !== null && px >= 44) {
            ctx.fillStyle = s.dark_text[r][c] ? "#111" : "#fff"; ctx.font = SMALL;
            ctx.fillText(humanBytes(value), x + px / 2, y + px / 2, px - 4);
          }
          this.items.push({row: r, col: c, x0: x, x1: x + px, y0: y, y1: y + px});
        });
        ctx.fillStyle = AXIS; ctx.textAlign = "right"; ctx.font = FONT;
        ctx.fillText(row, a.left - 6, a.top + (r + 0.5) * px);
        ctx.textAlign = "center";
      });
      ctx.save();
      s.cols.forEach((col, c) => {
        ctx.save();
        ctx.translate(a.left + (c + 0.5) * px, a.top + s.rows.length * px + 6);
        ctx.rotate(-Math.PI / 5);
        ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillStyle = AXIS; ctx.font = FONT;
        ctx.fillText(col, 0, 0);
        ctx.restore();
      });
      ctx.restore();
      ctx.fillStyle = AXIS; ctx.font = FONT; ctx.textAlign = "center"; ctx.textBaseline = "bottom";
      ctx.fillText(s.x_label, (a.left + a.right) / 2, this.height() - 4);
      this.yLabel(ctx);
    }

    // -- hover and zoom -------------------------------------------------------------------------------------
    hit(px, py) {
      let best = null, bestDistance = HIT_PX * HIT_PX;
      for (const item of this.items) {
        if ("px" in item) {
          const d = (item.px - px) ** 2 + (item.py - py) ** 2;
          if (d <= bestDistance) { best = item; bestDistance = d; }
        } else if (px >= item.x0 - 1 && px <= item.x1 + 1 && py >= item.y0 && py <= item.y1) best = item;
      }
      return best;
    }

    describe(item) {
      const s = this.spec;
      const rows = [];
      if (s.type === "matrix") {
        rows.push([s.y_name, s.rows[item.row]], [s.x_name, s.cols[item.col]]);
        for (const field of s.tip) {
          const value = s[field.key][item.row][item.col];
          rows.push([field.label, value === null ? "none" : formatValue(field.format, value)]);
        }
        return rows;
      }
      const source = "layer" in item ? s.layers[item.layer] : s.series[item.series];
      if (source.name) rows.push(["", source.name]);
      for (const field of source.tip) {
        const column = field.key === "x" ? source.x : field.key === "y" ? source.y : source.columns[field.key];
        const value = column[item.index];
        const categories = source.categories && source.categories[field.key];
        rows.push([field.label, categories ? categories[value] : value === null ? "n/a" : formatValue(field.format, value)]);
      }
      return rows;
    }

    showTip(event) {
      const bounds = this.canvas.getBoundingClientRect();
      const item = this.hit(event.clientX - bounds.left, event.clientY - bounds.top);
      if (!item) { this.tip.style.display = "none"; return; }
      this.tip.replaceChildren(...this.describe(item).map(([label, value]) => {
        const line = document.createElement("div");
        if (label) { const b = document.createElement("b"); b.textContent = label + " "; line.append(b); }
        line.append(document.createTextNode(value));
        return line;
      }));
      this.tip.style.display = "block";
      const rootBounds = this.root.getBoundingClientRect();
      let left = event.clientX - rootBounds.left + 14;
      if (left + this.tip.offsetWidth > rootBounds.width) left = event.clientX - rootBounds.left - this.tip.offsetWidth - 14;
      this.tip.style.left = Math.max(0, left) + "px";
      this.tip.style.top = (event.clientY - rootBounds.top + 14) + "px";
    }

    inside(px, py) { const a = this.area; return px >= a.left && px <= a.right && py >= a.top && py <= a.bottom; }

    zoomTo(x0, x1, y0, y1) {
      if (x1 > x0) [this.x.lo, this.x.hi] = [x0, x1];
      if (this.spec.y_range && y1 > y0) [this.y.lo, this.y.hi] = [y0, y1];
      this.draw();
    }

    listen() {
      if (this.spec.type === "matrix") {
        this.canvas.addEventListener("mousemove", (e) => this.showTip(e));
        this.canvas.addEventListener("mouseleave", () => { this.tip.style.display = "none"; });
        return;
      }
      const xy = this.spec.type !== "timeline";
      const position = (e) => { const b = this.canvas.getBoundingClientRect(); return [e.clientX - b.left, e.clientY - b.top]; };
      this.canvas.addEventListener("wheel", (e) => {
        const [px, py] = position(e);
        if (!this.inside(px, py)) return;
        if (!e.ctrlKey && Math.abs(e.deltaX) > Math.abs(e.deltaY)) {       // a sideways swipe pans
          e.preventDefault();
          const [lo, hi] = this.x.panned(-e.deltaX);
          this.zoomTo(lo, hi);
          return;
        }
        if (!e.ctrlKey) return;                                            // a plain wheel scrolls the page
        e.preventDefault();
        const factor = Math.exp(Math.max(-1, Math.min(1, e.deltaY / 300)));
        const [x0, x1] = this.x.zoomed(px, factor);
        const [y0, y1] = xy ? this.y.zoomed(py, factor) : [0, 0];
        this.zoomTo(x0, x1, y0, y1);
      }, {passive: false});
      this.canvas.addEventListener("mousedown", (e) => {
        const [px, py] = position(e);
        if (!this.inside(px, py) || e.button !== 0) return;
        e.preventDefault();
        this.drag = {pan: e.shiftKey, x: px, y: py, xs: [this.x.lo, this.x.hi], ys: [this.y.lo, this.y.hi]};
      });
      window.addEventListener("mousemove", (e) => {
        if (!this.drag) {
          if (e.target === this.canvas) this.showTip(e); else this.tip.style.display = "none";
          return;
        }
        const [px, py] = position(e);
        const d = this.drag;
        if (d.pan) {
          [this.x.lo, this.x.hi] = d.xs; [this.y.lo, this.y.hi] = d.ys;
          const [x0, x1] = this.x.panned(px - d.x);
          const [y0, y1] = xy ? this.y.panned(py - d.y) : [0, 0];
          this.zoomTo(x0, x1, y0, y1);
        } else {
          this.band = {x0: d.x, y0: d.y, x1: Math.max(this.area.left, Math.min(this.area.right, px)),
                       y1: Math.max(this.area.top, Math.min(this.area.bottom, py))};
          this.draw();
        }
      });
      window.addEventListener("mouseup", () => {
        const b = this.band;
        this.drag = null; this.band = null;
        if (!b) return;
        if (Math.abs(b.x1 - b.x0) < 4 && (!xy || Math.abs(b.y1 - b.y0) < 4)) { this.draw(); return; }
        const xs = [this.x.invert(Math.min(b.x0, b.x1)), this.x.invert(Math.max(b.x0, b.x1))];
        const ys = xy && Math.abs(b.y1 - b.y0) >= 4
          ? [this.y.invert(Math.max(b.y0, b.y1)), this.y.invert(Math.min(b.y0, b.y1))] : [0, 0];
        this.zoomTo(Math.abs(b.x1 - b.x0) >= 4 ? xs[0] : 0, Math.abs(b.x1 - b.x0) >= 4 ? xs[1] : 0, ys[0], ys[1]);
      });
      this.canvas.addEventListener("dblclick", () => this.reset());
      this.canvas.addEventListener("mouseleave", () => { if (!this.drag) this.tip.style.display = "none"; });
    }
  }

  const charts = [];
  for (const root of document.querySelectorAll("[data-chart]")) {
    const spec = JSON.parse(document.getElementById(root.dataset.chart).textContent);
    charts.push(new Chart(root, spec));
  }
  let pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(() => charts.forEach((chart) => chart.draw()), 100);
  });
  window.dlcsniffCharts = charts;
})();
