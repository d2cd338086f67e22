// A small time-series line chart on a <canvas>, with its legend as DOM text
// (series names come from the server: data, never markup). No library: a
// few lines of Canvas 2D are all the console needs.

import {h} from "./dom.js";

export const PALETTE = ["#2f6fde", "#e0712c", "#2a9d5b", "#c2417a", "#7a5cd6", "#b8962e", "#2aa6b8", "#8a8a8a"];

// new LineChart(title, {format: v => "12 ms", min: 0, max?: 1})
// chart.el: the element to place; chart.update(series) with
// series = [{name, points: [[time_ms, value|null], ...]}].
export class LineChart {
  constructor(title, opts = {}) {
    this.format = opts.format || ((v) => String(Math.round(v * 100) / 100));
    this.max = opts.max;
    this.canvas = h("canvas", {class: "chart-canvas", role: "img", "aria-label": title});
    this.legend = h("ul", {class: "legend"});
    this.empty = h("p", {class: "chart-empty"}, "Waiting for traffic…");
    this.el = h("figure", {class: "chart"}, h("figcaption", {}, title), this.canvas, this.empty, this.legend);
    this.series = [];
    this.resize = () => this.draw();
    window.addEventListener("resize", this.resize);
  }

  destroy() {
    window.removeEventListener("resize", this.resize);
  }

  update(series) {
    this.series = series;
    this.legend.replaceChildren(
      ...series.map((s, i) => {
        const last = [...s.points].reverse().find((p) => p[1] !== null);
        const swatch = h("span", {class: "swatch"});
        swatch.style.backgroundColor = PALETTE[i % PALETTE.length];
        return h("li", {}, swatch, h("span", {class: "legend-name"}, s.name), " ",
          h("span", {class: "legend-value"}, last ? this.format(last[1]) : "–"));
      }),
    );
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 480, ht = c.clientHeight || 180;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(ht * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(ht * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, ht);
    const pts = this.series.flatMap((s) => s.points.filter((p) => p[1] !== null));
    this.empty.hidden = pts.length > 0;
    if (pts.length === 0) return;
    const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
    let vmax = this.max !== undefined ? this.max : Math.max(...pts.map((p) => p[1]));
    if (!(vmax > 0)) vmax = 1;
    vmax = niceCeil(vmax);
    const left = 56, right = 8, top = 8, bottom = 22;
    const pw = w - left - right, ph = ht - top - bottom;
    const x = (t) => left + (t1 === t0 ? pw : ((t - t0) / (t1 - t0)) * pw);
    const y = (v) => top + ph - (Math.min(v, vmax) / vmax) * ph;
    const style = getComputedStyle(this.el);
    g.font = `11px ${style.fontFamily}`;
    g.strokeStyle = style.getPropertyValue("--grid") || "#ddd";
    g.fillStyle = style.getPropertyValue("--muted") || "#666";
    g.lineWidth = 1;
    g.textBaseline = "middle";
    g.textAlign = "right";
    for (let i = 0; i <= 4; i++) {
      const v = (vmax * i) / 4, yy = Math.round(y(v)) + 0.5;
      g.beginPath();
      g.moveTo(left, yy);
      g.lineTo(w - right, yy);
      g.stroke();
      g.fillText(this.format(v), left - 6, yy);
    }
    g.textAlign = "center";
    g.textBaseline = "alphabetic";
    const span = t1 - t0;
    for (let i = 0; i <= 4 && span > 0; i++) {
      const t = t0 + (span * i) / 4;
      g.fillText(new Date(t).toISOString().slice(11, 19), Math.min(Math.max(x(t), left + 24), w - right - 24), ht - 6);
    }
    this.series.forEach((s, i) => {
      g.strokeStyle = PALETTE[i % PALETTE.length];
      g.lineWidth = 2;
      g.beginPath();
      let pen = false;
      for (const [t, v] of s.points) {
        if (v === null) {
          pen = false;
          continue;
        }
        if (pen) g.lineTo(x(t), y(v));
        else g.moveTo(x(t), y(v));
        pen = true;
      }
      g.stroke();
      const lone = s.points.filter((p) => p[1] !== null);
      if (lone.length === 1) {
        g.fillStyle = PALETTE[i % PALETTE.length];
        g.beginPath();
        g.arc(x(lone[0][0]), y(lone[0][1]), 3, 0, Math.PI * 2);
        g.fill();
      }
    });
  }
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
