// Injected into a copy of a report by test_report_browser.py: once the page has loaded, it measures every chart,
// hovers, zooms (drag, ctrl+wheel), pans (shift+drag) and resets it with the mouse events a user's browser sends,
// and writes what it saw as JSON into a pre element (id probe) for `chromium --dump-dom`. With window.probeKeepZoom set,
// it leaves the charts zoomed and hovered, for a screenshot of that state.
"use strict";
window.addEventListener("load", () => {
  const range = (chart) => [Number(chart.root.dataset.xMin), Number(chart.root.dataset.xMax)];
  const inked = (canvas) => {
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let ink = 0;
    for (let i = 0; i < data.length; i += 4) if (data[i + 3] > 0 && Math.min(data[i], data[i + 1], data[i + 2]) < 230) ink++;
    return ink;
  };
  const mouse = (target, type, chart, px, py, extra) => {
    const bounds = chart.canvas.getBoundingClientRect();
    target.dispatchEvent(new MouseEvent(type, Object.assign(
      {clientX: bounds.left + px, clientY: bounds.top + py, bubbles: true, cancelable: true, button: 0}, extra || {})));
  };
  const hover = (chart) => {
    const item = chart.items[Math.floor(chart.items.length / 2)];
    if (!item) return null;
    const at = "px" in item ? [item.px, item.py] : [(item.x0 + item.x1) / 2, (item.y0 + item.y1) / 2];
    mouse(chart.canvas, "mousemove", chart, at[0], at[1]);
    return chart.tip.style.display === "block" ? chart.tip.textContent : null;
  };
  const drag = (chart, from, to, extra) => {
    const a = chart.area, y = (a.top + a.bottom) / 2;
    const x = (f) => a.left + (a.right - a.left) * f;
    mouse(chart.canvas, "mousedown", chart, x(from), y, extra);
    mouse(window, "mousemove", chart, x(to), y + (chart.spec.type === "timeline" ? 0 : 30), extra);
    mouse(window, "mouseup", chart, x(to), y, extra);
  };
  const result = {charts: [], figures: [], height: document.documentElement.scrollHeight};
  for (const chart of window.dlcsniffCharts || []) {
    const entry = {id: chart.root.id, type: chart.spec.type, width: chart.canvas.width, height: chart.canvas.height,
                   ink: inked(chart.canvas), drawn: Number(chart.root.dataset.drawn), initial: range(chart)};
    entry.tooltip = hover(chart);
    if (chart.spec.type !== "matrix") {
      drag(chart, 0.25, 0.5);
      entry.dragged = range(chart);
      chart.reset();
      const a = chart.area;
      const wheel = new WheelEvent("wheel", {clientX: chart.canvas.getBoundingClientRect().left + (a.left + a.right) / 2,
        clientY: chart.canvas.getBoundingClientRect().top + (a.top + a.bottom) / 2, deltaY: -300, ctrlKey: true,
        bubbles: true, cancelable: true});
      chart.canvas.dispatchEvent(wheel);
      entry.wheeled = range(chart);
      entry.wheelPrevented = wheel.defaultPrevented;
      const plain = new WheelEvent("wheel", {clientX: wheel.clientX, clientY: wheel.clientY, deltaY: 100, bubbles: true,
                                             cancelable: true});
      chart.canvas.dispatchEvent(plain);
      entry.plainWheelPrevented = plain.defaultPrevented;
      chart.reset();
      drag(chart, 0.5, 0.75, {shiftKey: true});
      entry.panned = range(chart);
      mouse(chart.canvas, "dblclick", chart, a.left + 5, a.top + 5);
      entry.reset = range(chart);
    }
    result.charts.push(entry);
  }
  if (window.probeKeepZoom) {                 // every chart zoomed in, the first timeline hovered (last: a move
    const charts = window.dlcsniffCharts;     // over another chart hides a tooltip)
    charts.filter((chart) => chart.spec.type !== "matrix").forEach((chart) => drag(chart, 0.55, 0.75));
    hover(charts.find((chart) => chart.spec.type === "timeline"));
  }
  for (const figure of document.querySelectorAll("figure")) {
    const box = figure.getBoundingClientRect();
    result.figures.push({id: figure.id, top: box.top + window.scrollY, left: box.left, width: box.width, height: box.height,
                         images: [...figure.querySelectorAll("img")].map((img) => img.naturalWidth),
                         charts: figure.querySelectorAll("canvas").length});
  }
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(result);
  document.body.append(out);
});
