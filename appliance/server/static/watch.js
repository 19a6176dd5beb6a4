// A stream's per-block latency table with the regression watch's verdicts: blocks
// slower than their baseline (a badge, and the trace recorded as evidence), the stream's
// other rows, and the host slower as a whole.

import { $, api, apiJson, auth, el, say, streamPath } from "./api.js";

/** Read the stream's watch and the host's, then draw (view: a StreamView). */
export async function refreshWatch(view) {
  let stream, report;
  try {
    [stream, report] = await Promise.all([
      apiJson("GET", streamPath(view.id)),
      apiJson("GET", "/v1/regressions").catch((err) => { // 404: an appliance without a watch
        if (err.status === 404) return { host: null };
        throw err;
      }),
    ]);
  } catch (err) {
    if (err.status !== 401) say("watch-status", `Regression watch: ${err.message}`);
    return;
  }
  say("watch-status", "");
  const regressions = stream.watch?.regressions ?? [];
  view.slower = new Map(regressions.filter((r) => r.kind === "block").map((r) => [r.block, r]));
  drawWatch(view);
  // The stream's others (its frame age): a line each. The host: one line, for every stream.
  const others = regressions.filter((r) => r.kind !== "block");
  drawLines("watch-other", others.map((r) => [
    `${r.name} is ${ratio(r)} slower than its baseline since ${r.started_at}.`, r]));
  const host = report.host;
  drawLines("watch-host", host ? [[`The host is ${ratio(host)} slower as a `
    + `whole since ${host.started_at} (probe ${ratio(host, "probe_ratio")}, rows `
    + `${ratio(host, "common_ratio")}): the machine, not a block. Blocks are judged on what `
    + "it does not explain.", host]] : []);
}

/** Lines of [text, regression], redrawn only when they change (as the table's rows). */
function drawLines(id, lines) {
  const box = $(id);
  const drawn = JSON.stringify([lines, auth.role]);
  if (box.dataset.drawn === drawn) return;
  box.dataset.drawn = drawn;
  box.replaceChildren(...lines.map(([text, r]) => watchLine(text, r)));
}

/** The per-block latency table, with a badge on each block in regression. Redrawn every
 * 2 s in place: a row replaced while a pointer presses its evidence link loses the click
 * (the press and the release land on two elements), so a row's cells change only where
 * their text does, and its name cell (the badge and the link) only when its regression does. */
export function drawWatch(view) {
  const report = view.report;
  if (!report) return;
  const ms = (x) => (x === null ? "–" : x.toFixed(2));
  const rows = [{ id: "workflow", type: "(whole run)", whole: true, ...report.workflow },
    ...report.blocks];
  const body = $("latency").tBodies[0];
  while (body.rows.length > rows.length) body.lastElementChild.remove();
  rows.forEach((b, i) => {
    const tr = body.rows[i] ?? body.appendChild(latencyRow());
    const regression = b.whole ? undefined : view.slower.get(b.id);
    const name = JSON.stringify([b.id, regression ?? null, auth.role]);
    if (tr.dataset.name !== name) {
      tr.dataset.name = name;
      tr.cells[0].replaceChildren(b.id, ...(regression ? [" ", ...regressionBadge(regression)] : []));
    }
    [b.type, ms(b.p50_ms), ms(b.p99_ms)].forEach((text, c) => {
      const cell = tr.cells[c + 1];
      if (cell.textContent !== text) cell.textContent = text;
    });
  });
  const fps = report.fps === null ? "–" : report.fps.toFixed(1);
  say("latency-summary", `Last ${report.frames} frames, ${fps} fps.`);
}

function latencyRow() {
  const tr = document.createElement("tr");
  for (const cls of ["", "", "num", "num"]) tr.append(el("td", "", cls));
  return tr;
}

const ratio = (r, field = "ratio") => (r[field] == null ? "×?" : `×${r[field].toFixed(2)}`);

function regressionBadge(r) {
  const badge = el("span", `slower ${ratio(r)}`, "badge badge-slower");
  const change = r.change ? `, after: ${r.change.summary} (${r.change.at})` : "";
  badge.title = `p50 ${r.baseline_p50_ms.toFixed(2)} ms in the baseline, ${r.current_p50_ms.toFixed(2)} ms `
    + `now (p99 ${r.baseline_p99_ms.toFixed(2)} → ${r.current_p99_ms.toFixed(2)} ms); `
    + `since ${r.started_at}${change}`;
  const link = evidenceLink(r);
  return link ? [badge, " ", link] : [badge];
}

function watchLine(text, r) {
  const line = el("p", text, "watch-line");
  const link = evidenceLink(r);
  if (link) line.append(" ", link);
  return line;
}

// The trace the watch recorded when the regression started: fetched with the token (a plain
// link would carry none), then saved. Only our own API's trace paths are followed.
function evidenceLink(r) {
  if (!auth.can("operator")) return null; // traces are an operator's (the API says 403)
  const path = r.evidence?.trace;
  if (typeof path !== "string" || !/^\/v1\/profiling\/[\w-]+\/trace$/.test(path)) return null;
  const link = el("a", "evidence trace", "evidence");
  link.href = path;
  link.addEventListener("click", (event) => {
    event.preventDefault();
    saveTrace(path, `appliance-regression-${r.id}.json`);
  });
  return link;
}

async function saveTrace(path, name) {
  let blob;
  try {
    blob = await (await api("GET", path)).blob();
  } catch (err) { // 409 while the window still records
    if (err.status !== 401) say("watch-status", `Evidence trace: ${err.message}`);
    return;
  }
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
  say("watch-status", `Saved ${name}: open it at ui.perfetto.dev (Open trace file).`);
}
