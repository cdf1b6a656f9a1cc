// The dashboard page: filters kept in the URL, one poll loop that asks the JSON API and updates the ECharts
// instances in place. Every text from the database goes into the page as text (textContent, or ECharts with its
// HTML encoding), never as markup.
"use strict";

const COLORS = { positive: "#2e9d5b", negative: "#d64545", neutral: "#8a94a6", mixed: "#e0a030", errors: "#5b6474" };
const LABELS = ["positive", "negative", "neutral", "mixed"];
const FONT = getComputedStyle(document.documentElement).fontFamily;
const esc = (s) => echarts.format.encodeHTML(String(s ?? ""));
const pct = (v) => (v === null || v === undefined ? "–" : (v * 100).toFixed(1) + "%");

const state = { hotel: "", from: "", to: "", lang: "" };
const page = { charts: {}, polls: 0, lastRefresh: null, meta: null, errors: [], refresh: null };
window.qwenspark = page;

function readUrl() {
  const q = new URLSearchParams(location.search);
  for (const key of Object.keys(state)) state[key] = q.get(key) || "";
  const poll = Number(q.get("poll"));
  return Number.isFinite(poll) && poll >= 1 ? poll : null;
}

function writeUrl() {
  const q = new URLSearchParams(location.search);
  for (const [key, value] of Object.entries(state)) value ? q.set(key, value) : q.delete(key);
  const qs = q.toString();
  history.replaceState(null, "", qs ? "?" + qs : location.pathname);
}

function apiQuery() {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value) q.set(key, value);
  return q.toString();
}

async function getJson(path) {
  const res = await fetch(path, { headers: { accept: "application/json" } });
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) throw new Error((body && body.error) || `${path}: HTTP ${res.status}`);
  return body;
}

function chart(name) {
  if (!page.charts[name]) {
    page.charts[name] = echarts.init(document.getElementById("chart-" + name), null, { renderer: "canvas" });
    window.addEventListener("resize", () => page.charts[name].resize());
  }
  return page.charts[name];
}

// An empty chart says so in its middle instead of drawing empty axes.
function emptyText(text) {
  return { type: "text", left: "center", top: "middle", silent: true,
           style: { text, fill: "#6b7685", fontSize: 14, fontFamily: FONT } };
}

function draw(name, option, empty) {
  const base = { textStyle: { fontFamily: FONT }, animationDuration: 300, graphic: empty ? [emptyText(empty)] : [] };
  chart(name).setOption({ ...base, ...option }, { replaceMerge: ["series", "graphic", "xAxis", "yAxis", "visualMap"] });
}

function drawMix(mix) {
  const ring = (counts) => [...LABELS, "errors"].map((k) => ({ name: k, value: counts[k],
    itemStyle: { color: COLORS[k] } })).filter((d) => d.value > 0);
  const series = [{ name: "All hotels", type: "pie", radius: state.hotel ? ["58%", "78%"] : ["40%", "72%"],
    center: ["50%", "48%"], data: ring(mix.overall), label: { formatter: "{b}\n{d}%" } }];
  if (mix.hotel) {
    series.push({ name: state.hotel, type: "pie", radius: ["0%", "42%"], center: ["50%", "48%"],
      data: ring(mix.hotel), label: { position: "inside", formatter: "{d}%", fontSize: 10 } });
  }
  const title = mix.hotel ? `outer: all hotels (${mix.overall.reviews}) · inner: ${state.hotel} (${mix.hotel.reviews})`
    : `${mix.overall.reviews} reviews`;
  draw("mix", { tooltip: { trigger: "item" },
    title: { text: title, left: "center", bottom: 0, textStyle: { fontSize: 12, fontWeight: "normal" } },
    series }, mix.overall.reviews ? null : "No results in this range");
  const select = document.getElementById("f-lang");
  const known = new Set([...select.options].map((o) => o.value));
  for (const { lang } of mix.langs) {
    const value = lang === "" ? "none" : lang;
    if (!known.has(value)) {
      select.add(new Option(lang === "" ? "(unknown)" : lang, value));
      known.add(value);
    }
  }
  select.value = state.lang;
}

function drawTrend(t) {
  const total = t.reviews.reduce((a, b) => a + b, 0);
  // Points between days without reviews draw no line: show them as dots on ranges short enough to read.
  const dots = t.days.length <= 120 || t.granularity === "month";
  const monthly = t.granularity === "month";
  document.getElementById("trend-title").textContent = monthly ? "Monthly trend" : "Daily trend";
  draw("trend", {
    tooltip: { trigger: "axis", valueFormatter: (v) => (v === null || v === undefined ? "no reviews" : v) },
    legend: { top: 0 }, grid: { left: 50, right: 50, top: 34, bottom: 40 },
    xAxis: [{ type: "category", data: t.days, axisLabel: { hideOverlap: true } }],
    yAxis: [{ type: "value", min: 0, max: 1, axisLabel: { formatter: (v) => v * 100 + "%" } },
            { type: "value", name: "reviews", minInterval: 1, splitLine: { show: false } }],
    dataZoom: t.days.length > 120 ? [{ type: "inside" }, { type: "slider", height: 14, bottom: 4 }] : [],
    series: [
      { name: "reviews", type: "bar", yAxisIndex: 1, data: t.reviews, itemStyle: { color: "#c9d3e3" } },
      { name: "positive share", type: "line", data: t.share_positive, showSymbol: dots, connectNulls: false,
        itemStyle: { color: COLORS.positive } },
      { name: "negative share", type: "line", data: t.share_negative, showSymbol: dots, connectNulls: false,
        itemStyle: { color: COLORS.negative } },
    ],
  }, total ? null : "No reviews in this range");
}

function drawRanking(r) {
  const rows = r.hotels.map((h) => ({ name: h.hotel_id, value: h.net, reviews: h.reviews }));
  if (r.others) rows.push({ name: `others (${r.others.hotels} hotels)`, value: r.others.net, reviews: r.others.reviews,
    others: true });
  draw("ranking", {
    tooltip: { trigger: "item", formatter: (p) => `${esc(p.name)}<br/>net sentiment ${p.value === null ? "–"
      : (p.value * 100).toFixed(0) + "%"}<br/>${p.data.reviews} reviews` },
    grid: { left: 8, right: 60, top: 8, bottom: 24, containLabel: true },
    xAxis: [{ type: "value", min: -1, max: 1, axisLabel: { formatter: (v) => v * 100 + "%" } }],
    // The review count goes beside the name: a label on the bar collides with the names at -100 %.
    yAxis: [{ type: "category", inverse: true, data: rows.map((d) => d.name),
              axisLabel: { width: 150, overflow: "truncate", interval: 0, fontSize: rows.length > 15 ? 10 : 12,
                           formatter: (name, i) => `${name} (${rows[i].reviews})` } }],
    series: [{ name: "net sentiment", type: "bar", data: rows.map((d) => ({ ...d,
      itemStyle: { color: d.others ? "#aab4c4" : (d.value || 0) >= 0 ? COLORS.positive : COLORS.negative,
                   borderColor: d.name === state.hotel ? "#17233a" : "transparent", borderWidth: 2 } })) }],
  }, rows.length ? null : "No hotels in this range");
  const list = document.getElementById("hotel-list");
  list.replaceChildren(...r.picker.map((h) => new Option(`${h.reviews} reviews`, h.hotel_id)));
}

function drawHeatmap(h) {
  const columns = h.others ? [...h.hotels, "others"] : h.hotels;
  page.lastHeatmap = columns;
  draw("heatmap", {
    tooltip: { formatter: (p) => `${esc(columns[p.value[0]])} · ${esc(h.aspects[p.value[1]])}<br/>negative `
      + `${pct(p.value[2])} of ${p.value[3]} mentions` },
    grid: { left: 8, right: 16, top: 8, bottom: 70, containLabel: true },
    xAxis: [{ type: "category", data: columns, splitArea: { show: true },
              axisLabel: { interval: 0, rotate: columns.length > 8 ? 45 : 0, width: 90, overflow: "truncate",
                           fontSize: columns.length > 15 ? 10 : 12 } }],
    yAxis: [{ type: "category", data: h.aspects, splitArea: { show: true } }],
    // dimension 2: the share negative (the cells are [hotel, aspect, share, mentions]).
    visualMap: [{ dimension: 2, min: 0, max: 1, calculable: false, orient: "horizontal", left: "center", bottom: 0, itemHeight: 120,
                  text: ["100% negative", "0%"], inRange: { color: ["#eaf6ee", "#f6d8a8", "#d64545"] },
                  formatter: (v) => pct(v) }],
    series: [{ name: "negative share", type: "heatmap", data: h.cells,
               label: { show: columns.length <= 12, formatter: (p) => (p.value[2] * 100).toFixed(0) + "%",
                        fontSize: 10 } }],
  }, h.cells.length ? null : "No aspects mentioned in this range");
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function drawReviews(reviews) {
  const box = document.getElementById("reviews");
  if (!reviews.length) {
    box.replaceChildren(el("div", "empty", "No negative or mixed reviews in this range"));
    return;
  }
  const template = page.meta && page.meta.review_url;
  box.replaceChildren(...reviews.map((r) => {
    const item = el("article", "review");
    item.dataset.reviewId = r.review_id;
    const meta = el("div", "meta");
    const link = el("a", null, "#" + r.review_id);
    link.href = template ? template.replace("{review_id}", encodeURIComponent(r.review_id))
      : "api/review/" + encodeURIComponent(r.review_id);
    link.target = "_blank";
    link.rel = "noopener noreferrer";
    meta.append(el("span", "label " + r.sentiment, r.sentiment), link, el("span", null, r.hotel_id),
      el("span", null, r.created_at), el("span", null, r.lang || "(unknown language)"));
    const aspects = el("div");
    for (const a of r.aspects) aspects.append(el("span", "chip " + a.sentiment, `${a.aspect}: ${a.sentiment}`));
    item.append(meta, el("div", "summary", r.summary), aspects);
    if (r.text) item.append(el("div", "text", r.text));
    return item;
  }));
}

function drawRuns(h) {
  const runs = [...h.runs].reverse();
  const box = document.getElementById("run-summary");
  const last = h.runs[0];
  if (!last) {
    box.replaceChildren(el("div", "empty", "No runs yet"));
  } else {
    const status = el("span", last.status, last.status);
    const line1 = el("div");
    line1.append("Last run: ", status, ` · ${last.job} · started ${last.started_at} UTC`);
    const line2 = el("div", null, `${last.rows_analysed} rows analysed, ${last.rows_error} errors` +
      (last.rows_per_s ? `, ${last.rows_per_s} rows/s` : "") + ` · error rate over the last ${h.runs.length} runs: ` +
      pct(h.error_rate));
    box.replaceChildren(line1, line2);
    if (last.status === "failed" && last.message) box.append(el("div", "failed", last.message));
  }
  draw("runs", {
    tooltip: { trigger: "axis" }, legend: { top: 0 }, grid: { left: 44, right: 44, top: 30, bottom: 24 },
    xAxis: [{ type: "category", data: runs.map((r) => r.started_at.slice(5, 16)), axisLabel: { hideOverlap: true } }],
    yAxis: [{ type: "value", name: "rows", minInterval: 1 },
            { type: "value", min: 0, max: 1, splitLine: { show: false }, axisLabel: { formatter: (v) => v * 100 + "%" } }],
    series: [
      { name: "rows analysed", type: "bar", data: runs.map((r) => ({ value: r.rows_analysed,
        itemStyle: { color: r.status === "failed" ? COLORS.negative : r.status === "running" ? "#9fb6e0" : "#7f9cc9" } })) },
      { name: "error rate", type: "line", yAxisIndex: 1, data: runs.map((r) => (r.rows_analysed
        ? +(r.rows_error / r.rows_analysed).toFixed(4) : null)), itemStyle: { color: COLORS.negative } },
    ],
  }, runs.length ? null : "No runs yet");
}

function showProblem(text) {
  document.getElementById("problem").textContent = text ? "· " + text : "";
}

async function refresh() {
  const q = apiQuery();
  try {
    // All at once: the server applies the same default range that meta reports.
    const suffix = q ? "?" + q : "";
    const [meta, mix, trend, ranking, heatmap, reviews, runs] = await Promise.all(
      ["meta", "mix", "trend", "ranking", "heatmap", "reviews", "runs"].map(
        (n) => getJson(`api/${n}${n === "runs" || n === "meta" ? "" : suffix}`)));
    page.meta = meta;
    page.pollSeconds = page.pollOverride || meta.poll_seconds;
    document.getElementById("f-from").value = state.from || meta.default_from;
    document.getElementById("f-to").value = state.to || meta.default_to;
    drawMix(mix); drawTrend(trend); drawRanking(ranking); drawHeatmap(heatmap); drawReviews(reviews); drawRuns(runs);
    page.lastRefresh = new Date();
    page.errors = [];
    showProblem("");
    const lastRun = runs.last_success ? ` · last successful run ${runs.last_success} UTC` : "";
    document.getElementById("refreshed").textContent =
      `Updated ${page.lastRefresh.toLocaleTimeString()} (every ${page.pollSeconds} s)${lastRun}`;
  } catch (err) {
    page.errors.push(String(err.message || err));
    showProblem(`${err.message || err}; showing the data of ${page.lastRefresh
      ? page.lastRefresh.toLocaleTimeString() : "no refresh yet"}`);
  } finally {
    page.polls += 1;
    if (page.polls === 1) page.firstLoadMs = performance.now();  // navigation start -> first charts drawn
  }
}
page.refresh = refresh;

function onFilter() {
  state.hotel = document.getElementById("f-hotel").value.trim();
  state.from = document.getElementById("f-from").value;
  state.to = document.getElementById("f-to").value;
  state.lang = document.getElementById("f-lang").value;
  writeUrl();
  refresh();
}

function selectHotel(name) {
  if (!name || name.startsWith("others")) return;
  document.getElementById("f-hotel").value = name;
  onFilter();
}

async function start() {
  page.pollOverride = readUrl();
  document.getElementById("f-hotel").value = state.hotel;
  if (state.lang) {  // a shared link's language, before the data lists the languages
    document.getElementById("f-lang").add(new Option(state.lang === "none" ? "(unknown)" : state.lang, state.lang));
  }
  document.getElementById("f-lang").value = state.lang;
  for (const id of ["f-hotel", "f-from", "f-to", "f-lang"]) document.getElementById(id).addEventListener("change", onFilter);
  document.getElementById("f-clear").addEventListener("click", () => {
    for (const id of ["f-hotel", "f-from", "f-to", "f-lang"]) document.getElementById(id).value = "";
    for (const key of Object.keys(state)) state[key] = "";
    writeUrl();
    refresh();
  });
  document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); onFilter(); });
  chart("ranking").on("click", (p) => selectHotel(p.name));
  chart("heatmap").on("click", (p) => {
    const h = page.lastHeatmap;
    if (h && p.value) selectHotel(h[p.value[0]]);
  });
  await refresh();
  const every = () => (page.pollSeconds || 30) * 1000;
  const loop = async () => { await refresh(); setTimeout(loop, every()); };
  setTimeout(loop, every());
}

document.addEventListener("DOMContentLoaded", start);
