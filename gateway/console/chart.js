// Delivery rate and latency over time, drawn on a canvas from `GET …/series` (no library).
import { h } from './dom.js';

/** A chart of `series` (`{bucket_seconds, points}`): attempts per minute as bars (2xx in
 * green, the rest in red) and the mean latency as a line on the right-hand axis. */
export function rateChart(title, series) {
  const points = series.points;
  const perMin = 60 / series.bucket_seconds;
  const total = points.reduce((n, p) => n + p.attempts, 0);
  const ok = points.reduce((n, p) => n + p.successes, 0);
  const withLatency = points.filter((p) => p.mean_ms !== null);
  const meanMs = withLatency.length ? withLatency.reduce((n, p) => n + p.mean_ms * p.attempts, 0) / total : null;
  const summary = `${title}: ${total} attempts, ${ok} answered 2xx` +
    (meanMs === null ? '' : `, mean latency ${meanMs.toFixed(1)} ms`);
  const canvas = h('canvas', { width: 900, height: 220, role: 'img', 'aria-label': summary });
  draw(canvas, points, perMin);
  return h('figure', {}, canvas,
    h('figcaption', { class: 'legend' }, summary,
      ` — bars: attempts per minute (green 2xx, red otherwise), line: mean latency (ms), ${points.length} buckets of ${series.bucket_seconds} s`));
}

function draw(canvas, points, perMin) {
  const ctx = canvas.getContext('2d');
  const W = canvas.width, H = canvas.height, L = 50, R = 50, T = 10, B = 24;
  const plotW = W - L - R, plotH = H - T - B;
  const maxRate = Math.max(1, ...points.map((p) => p.attempts * perMin));
  const maxMs = Math.max(1, ...points.map((p) => p.mean_ms ?? 0));
  const barW = plotW / Math.max(1, points.length);
  ctx.font = '11px system-ui, sans-serif';
  ctx.fillStyle = '#57606a';
  ctx.strokeStyle = '#d0d7de';
  ctx.strokeRect(L, T, plotW, plotH);
  ctx.fillText(`${fmt(maxRate)}/min`, 2, T + 10);
  ctx.fillText('0', L - 12, T + plotH);
  ctx.fillText(`${fmt(maxMs)} ms`, W - R + 4, T + 10);
  points.forEach((p, i) => {
    const x = L + i * barW;
    const okH = (p.successes * perMin / maxRate) * plotH;
    const badH = ((p.attempts - p.successes) * perMin / maxRate) * plotH;
    ctx.fillStyle = '#1a7f37';
    ctx.fillRect(x + 1, T + plotH - okH, Math.max(1, barW - 2), okH);
    ctx.fillStyle = '#b42318';
    ctx.fillRect(x + 1, T + plotH - okH - badH, Math.max(1, barW - 2), badH);
  });
  ctx.strokeStyle = '#0b5cad';
  ctx.lineWidth = 2;
  ctx.beginPath();
  let started = false;
  points.forEach((p, i) => {
    if (p.mean_ms === null) return;
    const x = L + i * barW + barW / 2, y = T + plotH - (p.mean_ms / maxMs) * plotH;
    if (started) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    started = true;
  });
  ctx.stroke();
  ctx.fillStyle = '#57606a';
  if (points.length) {
    ctx.fillText(points[0].start.slice(11, 16), L, H - 6);
    ctx.fillText(points[points.length - 1].start.slice(11, 16), W - R - 30, H - 6);
  }
}

function fmt(x) {
  return x >= 100 ? Math.round(x).toString() : x.toFixed(1);
}
